"""Write a small GGUF with random weights of a model family no shipped file has (hybrid and recurrent
targets), carrying a real tokenizer and chat template copied from another GGUF, so that text prompts and
chats work end to end.

    python scripts/random_gguf.py lfm2 OUT.gguf --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf
    python scripts/random_gguf.py qwen35 OUT.gguf --tokenizer ... --mtp 1

The tensors and hyperparameters each architecture needs are those llama.cpp's loader asks for
(`src/models/<arch>.cpp`, `load_arch_hparams` and `load_arch_tensors`, in the llama.cpp that
llama-cpp-python 0.3.36 vendors); its `tests/test-llama-archs.cpp` writes the same kind of file with a
dummy tokenizer. Weights are float32 drawn from N(0, stdev) with a fixed seed, so a file is the same
every time; the answers are gibberish, but every decode is the architecture's real computation.

Architectures:
- `lfm2`: LiquidAI's LFM2, short convolutions with attention every third layer (recurrent state that
  llama.cpp can roll back a few tokens with `n_rs_seq`); `--shape lfm2.5-1.2b` lays attention out as
  LFM2.5-1.2B does.
- `qwen35`: Qwen3.5, gated delta-net linear attention with full attention every fourth layer; with
  `--mtp 1`, the multi-token-prediction block the released files carry after the trunk
  (`blk.N.nextn.*`, `qwen35.nextn_predict_layers`): the head the `mtp` drafter drafts with.
- `glm4moe`: GLM-4.5's transformer (attention, a dense first block, then mixture-of-experts blocks with a
  shared expert); with `--mtp 1`, the MTP block GLM-4.5 ships after the trunk: a transformer with heads.
- `step35`: StepFun's Step-3.5, a transformer alternating full and sliding-window attention; with
  `--mtp N`, N MTP blocks after the trunk, which llama.cpp chains (head k drafts the k-th token:
  `llama_set_nextn_layer_offset`), the one family in its sources whose heads are several. Written with
  dense FFNs (llama.cpp takes a block without `ffn_gate_inp` as dense), the experts being no part of what
  the heads test.
- `mamba`: Mamba, recurrent layers only, a state llama.cpp cannot roll back (plain decoding only).
- `eagle3`: an EAGLE-3 draft for the GGUF given as `--tokenizer` (its width, heads and layers: the
  draft reads the inputs of three of its layers, `eagle3.target_layers`, and uses its token embeddings
  and output head), as the released EAGLE-3 drafts for Llama and Qwen are.
- `dflash`: a DFlash draft for the GGUF given as `--tokenizer` (its width and heads, two layers; the
  draft reads the inputs of three of its layers, `dflash.target_layers`, uses its token embeddings and
  output head, and fills blocks of `dflash.block_size` with a mask token), as the released DFlash
  drafts for Qwen3 and Llama are.
- `bert`: a BERT encoder (bidirectional attention, mean pooling, no output layer): an embedding model,
  as nomic-embed-text and bge are (`serve --embedding-model`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int = 0     # 0: n_embd / n_head
    rope_dim: int = 0     # qwen35: rotated dimensions of a head (0: all)
    ssm_state: int = 32   # qwen35: the head size of the delta net's keys and values
    ssm_heads: int = 2    # qwen35: value heads
    ssm_groups: int = 2   # qwen35: key heads
    f16: bool = False     # matrices in float16 (a real shape in float32 is twice the disk and memory)
    attention: tuple[int, ...] = ()  # lfm2: the attention layers (default: every third, from the third)

    @property
    def head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


SHAPES = {
    "tiny": Shape(n_embd=64, n_ff=128, n_layer=4, n_head=2, n_head_kv=1),
    # Qwen3.5-4B's dimensions (its config.json), for costs at a real size: quantize the file with
    # llama.cpp (backend.quantize) as a release would be. Its vocabulary is the tokenizer's you give.
    "qwen3.5-4b": Shape(n_embd=2560, n_ff=9216, n_layer=32, n_head=16, n_head_kv=4, head_dim=256, rope_dim=64,
                        ssm_state=128, ssm_heads=32, ssm_groups=16, f16=True),
    # LFM2.5-1.2B's (its config.json: FFN 12288 auto-adjusted to 8192; attention in 6 of 16 layers). A
    # tokenizer near its 65,536 tokens keeps the output layer's share real (SmolLM2's 49,152).
    "lfm2.5-1.2b": Shape(n_embd=2048, n_ff=8192, n_layer=16, n_head=32, n_head_kv=8,
                         attention=(2, 5, 8, 10, 12, 14), f16=True),
}
ARCHS = ("lfm2", "qwen35", "glm4moe", "step35", "gemma4", "mamba", "bert", "eagle3", "dflash", "gemma4-assistant")
MTP_ARCHS = ("qwen35", "glm4moe", "step35")
CHAINED_MTP_ARCHS = ("step35",)  # llama.cpp runs one MTP block for the others (src/models/<arch>.cpp)


class _Tensors:
    """Random tensors, named and shaped as llama.cpp reads them ({ne0, ne1}: numpy's reversed). Listed
    first, drawn one at a time while the file is written, so a real shape never sits in memory whole."""

    def __init__(self, seed: int, stdev: float, noise: float = 0.0, f16: bool = False):
        self.rng = np.random.default_rng(seed)
        self.stdev = stdev
        self.noise = noise  # a second draw on top: a "draft" that agrees with the seed's model only partly
        self.noise_rng = np.random.default_rng([seed, 1])
        self.f16 = f16
        self.listed: list[tuple[str, tuple[int, ...], np.dtype, bool, float, bool]] = []  # (…, negative, fill, eye)
        self.copies: dict[str, str] = {}  # a tensor written as another's values: its name -> the other's
        self.values: dict[str, np.ndarray] = {}  # tensors given whole (`given`)

    def add(self, name: str, *ne: int, negative: bool = False, ones: bool = False, eye: bool = False,
            fill: float = 0.0) -> None:
        """`eye`: plus the identity on the first ne1 columns (a projection that passes its first input on);
        `ones`, `fill`: every value 1, or `fill` (a norm's scale)."""
        fill = 1.0 if ones else fill
        matrix = len(ne) == 2 and not fill and "conv" not in name  # what llama.cpp multiplies by
        dtype = np.dtype(np.float16 if self.f16 and matrix else np.float32)
        self.listed.append((name, tuple(reversed(ne)), dtype, negative, fill, eye))

    def attention(self, p: str, s: "Shape") -> None:
        """A block's attention: queries, keys, values, output, and the heads' query and key norms."""
        head = s.head
        self.add(p + "attn_q.weight", s.n_embd, head * s.n_head)
        self.add(p + "attn_k.weight", s.n_embd, head * s.n_head_kv)
        self.add(p + "attn_v.weight", s.n_embd, head * s.n_head_kv)
        self.add(p + "attn_output.weight", head * s.n_head, s.n_embd)
        self.add(p + "attn_q_norm.weight", head, ones=True)
        self.add(p + "attn_k_norm.weight", head, ones=True)

    def given(self, name: str, values: np.ndarray) -> None:
        """A tensor with these values (numpy's shape), drawn from no random stream."""
        self.listed.append((name, values.shape, np.dtype(np.float32), False, 0.0, False))
        self.values[name] = values

    def copy(self, name: str, of: str) -> None:
        """A tensor with the values of `of` (listed before it): an output layer tied to the embeddings."""
        source = next(entry for entry in self.listed if entry[0] == of)
        self.listed.append((name,) + source[1:])
        self.copies[name] = of

    def block_start(self, p: str, s: "Shape", ffn_norm: str) -> None:
        """A block's norms (the second one by the name its architecture gives it) and its gated FFN."""
        self.add(p + "attn_norm.weight", s.n_embd, ones=True)
        self.add(p + f"{ffn_norm}.weight", s.n_embd, ones=True)
        self.add(p + "ffn_gate.weight", s.n_embd, s.n_ff)
        self.add(p + "ffn_up.weight", s.n_embd, s.n_ff)
        self.add(p + "ffn_down.weight", s.n_ff, s.n_embd)

    def write(self, writer: gguf.GGUFWriter) -> None:
        for name, shape, dtype, *_how in self.listed:
            writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        kept = {}  # the values of tensors that others copy
        for name, shape, dtype, negative, fill, eye in self.listed:
            if name in self.values:
                data = self.values[name]
            elif name in self.copies:
                data = kept[self.copies[name]]
            else:
                data = self._draw(shape, negative, fill, eye)
            if name in self.copies.values():
                kept[name] = data
            writer.write_tensor_data(data.astype(dtype))

    def _draw(self, shape: tuple[int, ...], negative: bool, fill: float, eye: bool = False) -> np.ndarray:
        if fill:  # norms: random scales would only make the gibberish louder
            return np.full(shape, fill, dtype=np.float32)
        data = self.rng.normal(0.0, self.stdev, size=shape).astype(np.float32)
        if self.noise:
            data += self.noise_rng.normal(0.0, self.noise, size=shape).astype(np.float32)
        if negative:  # a state's decay must be negative (llama.cpp's test writes -|x| too)
            data = -np.abs(data)
        if eye:
            data[:, :shape[0]] += np.eye(shape[0], dtype=np.float32)
        return data


def _copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> int:
    """Every `tokenizer.*` key of `source` (chat template included); returns the vocabulary's size."""
    reader = gguf.GGUFReader(source)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        main = field.types[0]
        if main == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        elif main == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        else:
            writer.add_key_value(key, value, main)
    if not n_vocab:
        raise SystemExit(f"{source} has no tokenizer.ggml.tokens to copy")
    return n_vocab


def _lfm2(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int) -> None:
    # LFM2 puts attention between short convolutions
    attention = [i in s.attention if s.attention else i % 3 == 2 for i in range(s.n_layer)]
    w.add_uint32("lfm2.attention.head_count", s.n_head)  # a layer without kv heads is a convolution
    w.add_array("lfm2.attention.head_count_kv", [s.n_head_kv if a else 0 for a in attention])
    w.add_uint32("lfm2.shortconv.l_cache", 3)
    head = s.n_embd // s.n_head
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("token_embd_norm.weight", s.n_embd, ones=True)  # LFM2's output norm keeps this name
    for i, is_attention in enumerate(attention):
        p = f"blk.{i}."
        t.block_start(p, s, "ffn_norm")
        if is_attention:
            t.add(p + "attn_q_norm.weight", head, ones=True)
            t.add(p + "attn_k_norm.weight", head, ones=True)
            t.add(p + "attn_q.weight", s.n_embd, s.n_embd)
            t.add(p + "attn_k.weight", s.n_embd, head * s.n_head_kv)
            t.add(p + "attn_v.weight", s.n_embd, head * s.n_head_kv)
            t.add(p + "attn_output.weight", s.n_embd, s.n_embd)
        else:
            t.add(p + "shortconv.conv.weight", 3, s.n_embd)
            t.add(p + "shortconv.in_proj.weight", s.n_embd, 3 * s.n_embd)
            t.add(p + "shortconv.out_proj.weight", s.n_embd, s.n_embd)


def _qwen35(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int, mtp: int = 0) -> None:
    interval = 4  # full attention every fourth layer, as the released Qwen3.5 models
    head = s.head
    if mtp:  # the block count includes the MTP blocks, which come after the trunk
        w.add_uint32("qwen35.nextn_predict_layers", mtp)
    key_dim, value_dim = s.ssm_state * s.ssm_groups, s.ssm_state * s.ssm_heads
    w.add_uint32("qwen35.attention.head_count", s.n_head)
    w.add_uint32("qwen35.attention.head_count_kv", s.n_head_kv)
    w.add_uint32("qwen35.attention.key_length", head)
    w.add_uint32("qwen35.attention.value_length", head)
    w.add_uint32("qwen35.full_attention_interval", interval)
    if s.rope_dim:  # partial rotation, in sections as the released files (t, h, w of M-RoPE; text uses t)
        w.add_uint32("qwen35.rope.dimension_count", s.rope_dim)
        w.add_array("qwen35.rope.dimension_sections", [s.rope_dim // 6 + 1, s.rope_dim // 6 + 1,
                                                       s.rope_dim // 2 - 2 * (s.rope_dim // 6 + 1), 0])
    else:
        w.add_array("qwen35.rope.dimension_sections", [head // 4] * 4)
    w.add_uint32("qwen35.ssm.conv_kernel", 4)
    w.add_uint32("qwen35.ssm.inner_size", value_dim)
    w.add_uint32("qwen35.ssm.state_size", s.ssm_state)
    w.add_uint32("qwen35.ssm.time_step_rank", s.ssm_heads)
    w.add_uint32("qwen35.ssm.group_count", s.ssm_groups)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("output_norm.weight", s.n_embd, ones=True)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t.block_start(p, s, "post_attention_norm")
        if (i + 1) % interval == 0:
            t.add(p + "attn_q.weight", s.n_embd, head * s.n_head * 2)  # queries and their gates
            t.add(p + "attn_k.weight", s.n_embd, head * s.n_head_kv)
            t.add(p + "attn_v.weight", s.n_embd, head * s.n_head_kv)
            t.add(p + "attn_output.weight", head * s.n_head, s.n_embd)
            t.add(p + "attn_q_norm.weight", head, ones=True)
            t.add(p + "attn_k_norm.weight", head, ones=True)
        else:
            t.add(p + "attn_qkv.weight", s.n_embd, key_dim * 2 + value_dim)
            t.add(p + "attn_gate.weight", s.n_embd, value_dim)
            t.add(p + "ssm_conv1d.weight", 4, key_dim * 2 + value_dim)
            t.add(p + "ssm_dt.bias", s.ssm_heads)
            t.add(p + "ssm_a", s.ssm_heads, negative=True)
            t.add(p + "ssm_beta.weight", s.n_embd, s.ssm_heads)
            t.add(p + "ssm_alpha.weight", s.n_embd, s.ssm_heads)
            t.add(p + "ssm_norm.weight", s.ssm_state, ones=True)
            t.add(p + "ssm_out.weight", value_dim, s.n_embd)
    for i in range(s.n_layer, s.n_layer + mtp):
        p = f"blk.{i}."  # a full-attention block fed [norm(token embedding); norm(trunk's hidden state)]
        t.block_start(p, s, "post_attention_norm")
        t.add(p + "attn_q.weight", s.n_embd, head * s.n_head * 2)
        t.add(p + "attn_k.weight", s.n_embd, head * s.n_head_kv)
        t.add(p + "attn_v.weight", s.n_embd, head * s.n_head_kv)
        t.add(p + "attn_output.weight", head * s.n_head, s.n_embd)
        t.add(p + "attn_q_norm.weight", head, ones=True)
        t.add(p + "attn_k_norm.weight", head, ones=True)
        _nextn(t, p, s)


def _nextn(t: _Tensors, p: str, s: Shape) -> None:
    """An MTP block's own tensors: the projection of [norm(token embedding); norm(trunk's state)]. Passing
    the token's embedding on, the head predicts what a trunk of small weights does (the embedding's
    nearest token: the same one again), so drafts are kept where the trunk repeats."""
    t.add(p + "nextn.eh_proj.weight", 2 * s.n_embd, s.n_embd, eye=True)
    t.add(p + "nextn.enorm.weight", s.n_embd, ones=True)
    t.add(p + "nextn.hnorm.weight", s.n_embd, ones=True)
    t.add(p + "nextn.shared_head_norm.weight", s.n_embd, ones=True)


def _glm4moe(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int, mtp: int = 0) -> None:
    n_expert, n_used, n_ff_exp = 4, 2, s.n_ff // 4
    head = s.head
    w.add_uint32("glm4moe.attention.head_count", s.n_head)
    w.add_uint32("glm4moe.attention.head_count_kv", s.n_head_kv)
    w.add_uint32("glm4moe.expert_count", n_expert)
    w.add_uint32("glm4moe.expert_used_count", n_used)
    w.add_uint32("glm4moe.expert_shared_count", 1)
    w.add_uint32("glm4moe.expert_feed_forward_length", n_ff_exp)
    w.add_uint32("glm4moe.leading_dense_block_count", 1)
    w.add_float32("glm4moe.expert_weights_scale", 1.0)
    w.add_bool("glm4moe.expert_weights_norm", True)
    if mtp:
        w.add_uint32("glm4moe.nextn_predict_layers", mtp)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("output_norm.weight", s.n_embd, ones=True)
    for i in range(s.n_layer + mtp):
        p = f"blk.{i}."
        t.add(p + "attn_norm.weight", s.n_embd, ones=True)
        t.add(p + "post_attention_norm.weight", s.n_embd, ones=True)
        t.add(p + "attn_q.weight", s.n_embd, head * s.n_head)
        t.add(p + "attn_k.weight", s.n_embd, head * s.n_head_kv)
        t.add(p + "attn_v.weight", s.n_embd, head * s.n_head_kv)
        t.add(p + "attn_output.weight", head * s.n_head, s.n_embd)
        if i == 0:  # the leading dense block
            t.add(p + "ffn_gate.weight", s.n_embd, s.n_ff)
            t.add(p + "ffn_up.weight", s.n_embd, s.n_ff)
            t.add(p + "ffn_down.weight", s.n_ff, s.n_embd)
        else:
            t.add(p + "ffn_gate_inp.weight", s.n_embd, n_expert)
            t.add(p + "exp_probs_b.bias", n_expert)
            t.add(p + "ffn_gate_exps.weight", s.n_embd, n_ff_exp, n_expert)
            t.add(p + "ffn_up_exps.weight", s.n_embd, n_ff_exp, n_expert)
            t.add(p + "ffn_down_exps.weight", n_ff_exp, s.n_embd, n_expert)
            t.add(p + "ffn_gate_shexp.weight", s.n_embd, n_ff_exp)
            t.add(p + "ffn_up_shexp.weight", s.n_embd, n_ff_exp)
            t.add(p + "ffn_down_shexp.weight", n_ff_exp, s.n_embd)
        if i >= s.n_layer:
            _nextn(t, p, s)


def _step35(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int, n_ctx: int, mtp: int = 0) -> None:
    w.add_uint32("step35.attention.head_count", s.n_head)
    w.add_uint32("step35.attention.head_count_kv", s.n_head_kv)
    w.add_uint32("step35.expert_feed_forward_length", s.n_ff)  # read always, used by expert blocks only
    # odd trunk layers slide (a window as long as the context, so a rollback never meets a pruned cell);
    # the MTP blocks attend fully
    w.add_uint32("step35.attention.sliding_window", n_ctx)
    w.add_array("step35.attention.sliding_window_pattern", [i % 2 for i in range(s.n_layer)] + [0] * mtp)
    if mtp:
        w.add_uint32("step35.nextn_predict_layers", mtp)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("output_norm.weight", s.n_embd, ones=True)
    # the output layer (required here) tied to the embeddings, as files without one are: a trunk of
    # small weights then often repeats its input token, which the heads predict (_nextn)
    t.copy("output.weight", of="token_embd.weight")
    for i in range(s.n_layer + mtp):
        p = f"blk.{i}."
        t.block_start(p, s, "ffn_norm")
        t.attention(p, s)
        if i >= s.n_layer:
            _nextn(t, p, s)


# Gemma 4's norms after attention and FFN, before the residual: the target's leave it answering varied
# text that settles into repeating a token; the assistant's leave its input token foremost, so its drafts
# are often kept where the target repeats, yet depend on the states it is fed
POST_NORM = 0.7
ASSISTANT_POST_NORM = 0.5


def _gemma4(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int, n_ctx: int) -> None:
    """Gemma 4's transformer without per-layer embeddings: sliding-window attention in every layer but the
    last (a Gemma 4 assistant reads the last sliding and the last full layers' caches), each attention and
    FFN output normed again before the residual, GELU FFNs, the output tied to the embeddings."""
    head = s.head
    w.add_uint32("gemma4.attention.head_count", s.n_head)
    w.add_uint32("gemma4.attention.head_count_kv", s.n_head_kv)
    w.add_uint32("gemma4.attention.key_length", head)
    w.add_uint32("gemma4.attention.value_length", head)
    w.add_uint32("gemma4.attention.key_length_swa", head)
    w.add_uint32("gemma4.attention.value_length_swa", head)
    w.add_uint32("gemma4.attention.sliding_window", n_ctx)  # as long as the context: rollbacks meet no pruned cell
    w.add_array("gemma4.attention.sliding_window_pattern", [i != s.n_layer - 1 for i in range(s.n_layer)])
    w.add_uint32("gemma4.embedding_length_per_layer_input", 0)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("output_norm.weight", s.n_embd, ones=True)
    t.add("rope_freqs.weight", head // 2, ones=True)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t.block_start(p, s, "ffn_norm")
        t.attention(p, s)
        # outputs normed again, to a scale well below the embeddings' (times sqrt(width) here), so that
        # as in the other files the trunk often repeats its input token
        t.add(p + "post_attention_norm.weight", s.n_embd, fill=POST_NORM)
        t.add(p + "post_ffw_norm.weight", s.n_embd, fill=POST_NORM)


def _gemma4_assistant(w: gguf.GGUFWriter, t: _Tensors, target: Path, n_ctx: int, blocks: int = 2) -> None:
    """A Gemma 4 assistant (llama.cpp's `gemma4-assistant`, src/models/gemma4-assistant.cpp) for the Gemma 4
    file given: layers with queries only, attending through the target's cache (its last sliding and last
    full layers' keys and values), fed [the token's target embedding; the target's state] and returning a
    state of the target's width for the next step. Narrower than its target (three quarters), its token
    embeddings (its output layer) the target's first columns, and its input projection passing those on:
    the assistant predicts what a target of small weights does, the token it was given, again."""
    reader = gguf.GGUFReader(target)
    n_target, _n_layer, n_head, n_head_kv, n_ff = _target_dims(reader)
    head = int(reader.fields["gemma4.attention.key_length"].contents())
    n_embd = n_target * 3 // 4
    embeddings = next(np.array(x.data) for x in reader.tensors if x.name == "token_embd.weight")
    w.add_embedding_length(n_embd)
    w.add_uint32("gemma4-assistant.embedding_length_out", n_target)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(blocks)
    w.add_uint32("gemma4-assistant.nextn_predict_layers", blocks)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_uint32("gemma4-assistant.attention.key_length", head)
    w.add_uint32("gemma4-assistant.attention.value_length", head)
    w.add_uint32("gemma4-assistant.attention.key_length_swa", head)
    w.add_uint32("gemma4-assistant.attention.value_length_swa", head)
    w.add_uint32("gemma4-assistant.attention.sliding_window", n_ctx)
    w.add_array("gemma4-assistant.attention.sliding_window_pattern", [i != blocks - 1 for i in range(blocks)])
    t.given("token_embd.weight", np.ascontiguousarray(embeddings[:, :n_embd].astype(np.float32)))
    t.add("output_norm.weight", n_embd, ones=True)
    t.add("nextn.post_projection.weight", n_embd, n_target)
    t.add("rope_freqs.weight", head // 2, ones=True)
    t.add("nextn.pre_projection.weight", 2 * n_target, n_embd, eye=True)
    for i in range(blocks):
        p = f"blk.{i}."
        t.add(p + "attn_norm.weight", n_embd, ones=True)
        t.add(p + "attn_q.weight", n_embd, head * n_head)
        t.add(p + "attn_output.weight", head * n_head, n_embd)
        t.add(p + "attn_q_norm.weight", head, ones=True)
        t.add(p + "post_attention_norm.weight", n_embd, fill=ASSISTANT_POST_NORM)
        t.add(p + "layer_output_scale.weight", 1, ones=True)
        t.add(p + "ffn_norm.weight", n_embd, ones=True)
        t.add(p + "ffn_gate.weight", n_embd, n_ff)
        t.add(p + "ffn_up.weight", n_embd, n_ff)
        t.add(p + "ffn_down.weight", n_ff, n_embd)
        t.add(p + "post_ffw_norm.weight", n_embd, fill=ASSISTANT_POST_NORM)


def _mamba(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int) -> None:
    inner, state, rank = 2 * s.n_embd, 16, 4  # llama.cpp supports an expansion factor of 2 only
    w.add_uint32("mamba.ssm.conv_kernel", 4)
    w.add_uint32("mamba.ssm.inner_size", inner)
    w.add_uint32("mamba.ssm.state_size", state)
    w.add_uint32("mamba.ssm.time_step_rank", rank)
    w.add_uint32("mamba.attention.head_count", 0)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("output_norm.weight", s.n_embd, ones=True)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        t.add(p + "attn_norm.weight", s.n_embd, ones=True)
        t.add(p + "ssm_in.weight", s.n_embd, 2 * inner)
        t.add(p + "ssm_conv1d.weight", 4, inner)
        t.add(p + "ssm_conv1d.bias", inner)
        t.add(p + "ssm_x.weight", inner, rank + 2 * state)
        t.add(p + "ssm_dt.weight", rank, inner)
        t.add(p + "ssm_dt.bias", inner)
        t.add(p + "ssm_a", state, inner, negative=True)
        t.add(p + "ssm_d", inner)
        t.add(p + "ssm_out.weight", inner, s.n_embd)


def _bert(w: gguf.GGUFWriter, t: _Tensors, s: Shape, n_vocab: int, n_ctx: int) -> None:
    w.add_uint32("bert.attention.head_count", s.n_head)
    w.add_float32("bert.attention.layer_norm_epsilon", 1e-12)
    w.add_bool("bert.attention.causal", False)
    w.add_uint32("bert.pooling_type", 1)  # mean
    w.add_uint32("tokenizer.ggml.token_type_count", 2)
    t.add("token_embd.weight", s.n_embd, n_vocab)
    t.add("token_types.weight", s.n_embd, 2)
    t.add("position_embd.weight", s.n_embd, n_ctx)
    t.add("token_embd_norm.weight", s.n_embd, ones=True)
    t.add("token_embd_norm.bias", s.n_embd)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t.add(p + f"{name}.weight", s.n_embd, s.n_embd)
            t.add(p + f"{name}.bias", s.n_embd)
        for norm in ("attn_output_norm", "layer_output_norm"):
            t.add(p + f"{norm}.weight", s.n_embd, ones=True)
            t.add(p + f"{norm}.bias", s.n_embd)
        t.add(p + "ffn_up.weight", s.n_embd, s.n_ff)
        t.add(p + "ffn_up.bias", s.n_ff)
        t.add(p + "ffn_down.weight", s.n_ff, s.n_embd)
        t.add(p + "ffn_down.bias", s.n_embd)


def _target_dims(reader: gguf.GGUFReader) -> tuple[int, int, int, int, int]:
    """A target GGUF's width, layers, heads, KV heads and FFN width: what a draft for it is shaped by."""
    arch = reader.fields["general.architecture"].contents()
    return tuple(int(reader.fields[f"{arch}.{key}"].contents())  # type: ignore[return-value]
                 for key in ("embedding_length", "block_count", "attention.head_count",
                             "attention.head_count_kv", "feed_forward_length"))


def _beside_target(w: gguf.GGUFWriter, arch: str, target: Path, blocks: int) -> tuple[int, int, int, int, int]:
    """What a draft that reads the target's layer inputs (EAGLE-3, DFlash) shares: the target's width,
    heads and FFN, `blocks` layers of its own, and the target's layers it reads (low, middle and high, as
    EAGLE-3 trains on). Returns the target's dims."""
    dims = n_embd, n_layer, n_head, n_head_kv, n_ff = _target_dims(gguf.GGUFReader(target))
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(blocks)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_array(f"{arch}.target_layers", [1, n_layer // 2, n_layer - 3])
    return dims


def _eagle3(w: gguf.GGUFWriter, t: _Tensors, target: Path) -> None:
    """One decoder layer over [norm(token embedding); norm(g)], g = fc(the target's inputs to three of its
    layers); no token embeddings or output head of its own (the target's are used)."""
    n_embd, _n_layer, n_head, n_head_kv, n_ff = _beside_target(w, "eagle3", target, blocks=1)
    head = n_embd // n_head
    w.add_uint32("eagle3.target_hidden_size", n_embd)
    t.add("fc.weight", 3 * n_embd, n_embd)
    t.add("output_norm.weight", n_embd, ones=True)
    p = "blk.0."
    t.add(p + "attn_norm.weight", n_embd, ones=True)
    t.add(p + "attn_norm_2.weight", n_embd, ones=True)
    t.add(p + "attn_q.weight", 2 * n_embd, head * n_head)
    t.add(p + "attn_k.weight", 2 * n_embd, head * n_head_kv)
    t.add(p + "attn_v.weight", 2 * n_embd, head * n_head_kv)
    t.add(p + "attn_output.weight", head * n_head, n_embd)
    t.add(p + "ffn_norm.weight", n_embd, ones=True)
    t.add(p + "ffn_gate.weight", n_embd, n_ff)
    t.add(p + "ffn_up.weight", n_embd, n_ff)
    t.add(p + "ffn_down.weight", n_ff, n_embd)


def _dflash(w: gguf.GGUFWriter, t: _Tensors, target: Path, mask_token: int, block_size: int = 8) -> None:
    """A block drafter (llama.cpp's `dflash`, src/models/dflash.cpp): the target's inputs to three of its
    layers fused by `fc` into K/V written at the target's positions; one pass over the pending token and
    block_size - 1 mask tokens, attending to them and to each other both ways, predicts the block. Two
    layers of the target's width; no token embeddings or output head of its own (the target's are used).
    The target's tokenizer is copied with a mask token (`mask_token`, what fills the block's slots)."""
    n_embd, _n_layer, n_head, n_head_kv, n_ff = _beside_target(w, "dflash", target, blocks=2)
    head = n_embd // n_head
    w.add_uint32("dflash.block_size", block_size)
    w.add_uint32("tokenizer.ggml.mask_token_id", mask_token)
    t.add("fc.weight", 3 * n_embd, n_embd)
    t.add("enc.output_norm.weight", n_embd, ones=True)
    t.add("output_norm.weight", n_embd, ones=True)
    for i in range(2):
        p = f"blk.{i}."
        t.add(p + "attn_norm.weight", n_embd, ones=True)
        t.add(p + "attn_q.weight", n_embd, head * n_head)
        t.add(p + "attn_k.weight", n_embd, head * n_head_kv)
        t.add(p + "attn_v.weight", n_embd, head * n_head_kv)
        t.add(p + "attn_output.weight", head * n_head, n_embd)
        t.add(p + "attn_q_norm.weight", head, ones=True)
        t.add(p + "attn_k_norm.weight", head, ones=True)
        t.add(p + "ffn_norm.weight", n_embd, ones=True)
        t.add(p + "ffn_gate.weight", n_embd, n_ff)
        t.add(p + "ffn_up.weight", n_embd, n_ff)
        t.add(p + "ffn_down.weight", n_ff, n_embd)


def write(arch: str, out: Path, tokenizer: Path, *, shape: str = "tiny", seed: int = 0,
          stdev: float = 0.1, noise: float = 0.0, n_ctx: int = 4096, mtp: int = 0, mask_token: int = 0) -> Path:
    if arch not in ARCHS:
        raise SystemExit(f"unknown architecture {arch!r}; one of: {', '.join(ARCHS)}")
    if mtp and arch not in MTP_ARCHS:
        raise SystemExit(f"MTP blocks are written for {' and '.join(MTP_ARCHS)} only, not {arch}")
    if mtp > 1 and arch not in CHAINED_MTP_ARCHS:
        raise SystemExit(f"llama.cpp runs a single MTP block for {arch} (src/models/*.cpp); "
                         f"several for {', '.join(CHAINED_MTP_ARCHS)} only")
    s = SHAPES[shape]
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(f"random-{arch}-{shape}")
    w.add_context_length(n_ctx)
    if arch not in ("eagle3", "dflash", "gemma4-assistant"):  # (their dimensions are their target's)
        w.add_embedding_length(s.n_embd)
        w.add_feed_forward_length(s.n_ff)
        w.add_block_count(s.n_layer + mtp)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if s.f16 else gguf.LlamaFileType.ALL_F32)
    n_vocab = _copy_tokenizer(w, tokenizer)
    w.add_vocab_size(n_vocab)
    tensors = _Tensors(seed, stdev, noise, s.f16)
    if arch == "bert":
        _bert(w, tensors, s, n_vocab, n_ctx)
    elif arch == "eagle3":
        _eagle3(w, tensors, tokenizer)
    elif arch == "dflash":
        _dflash(w, tensors, tokenizer, mask_token)
    elif arch == "qwen35":
        _qwen35(w, tensors, s, n_vocab, mtp)
    elif arch == "glm4moe":
        _glm4moe(w, tensors, s, n_vocab, mtp)
    elif arch == "step35":
        _step35(w, tensors, s, n_vocab, n_ctx, mtp)
    elif arch == "gemma4":
        _gemma4(w, tensors, s, n_vocab, n_ctx)
    elif arch == "gemma4-assistant":
        _gemma4_assistant(w, tensors, tokenizer, n_ctx)
    else:
        {"lfm2": _lfm2, "mamba": _mamba}[arch](w, tensors, s, n_vocab)
    tensors.write(w)
    w.close()
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", choices=ARCHS)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="a GGUF whose tokenizer and chat template the file carries")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stdev", type=float, default=0.1)
    parser.add_argument("--noise", type=float, default=0.0,
                        help="stdev of a second draw added to every weight: with the target's seed, a draft "
                             "that agrees with it only partly")
    parser.add_argument("--mtp", type=int, default=0, metavar="N",
                        help="multi-token-prediction blocks after the trunk (qwen35, glm4moe: 0 or 1; "
                             "step35: any, chained by the `mtp` drafter)")
    args = parser.parse_args(argv)
    path = write(args.arch, args.out, args.tokenizer, shape=args.shape, seed=args.seed, stdev=args.stdev,
                 noise=args.noise, mtp=args.mtp)
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
