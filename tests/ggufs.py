"""Small vocab-only GGUFs for pairing tests, written with the gguf package."""

from __future__ import annotations

from pathlib import Path

import gguf


def write_vocab_only(source: Path, dest: Path, *, rename_token: tuple[int, str] | None = None,
                     overrides: dict | None = None) -> Path:
    """Copy every metadata key of `source` (tokenizer included) into a GGUF with no tensors."""
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dest, arch)
    overrides = overrides or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = overrides.get(key, field.contents())
        if key == "tokenizer.ggml.tokens" and rename_token:
            value = list(value)
            index, text = rename_token
            value[index] = text
        main = field.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        elif main == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        else:
            writer.add_key_value(key, value, main)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest
