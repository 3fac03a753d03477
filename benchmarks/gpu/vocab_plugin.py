"""Device-only pytest plugin (benchmarks/gpu/check.sh): the test model's weights (85 MB) do not travel to the
GPU machine, so the tests that need only its tokenizer get a vocab-only copy (GPU_SMOLLM2_VOCAB); tests
that need other models are skipped."""
import os
import sys
from pathlib import Path

import pytest

VOCAB = Path(os.environ["GPU_SMOLLM2_VOCAB"])


def _pull(model_id):
    if model_id == "smollm2-135m":
        return VOCAB
    pytest.skip(f"{model_id}: weights not carried to the device")


def pytest_collection_modifyitems(session, config, items):
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").endswith("conftest") and hasattr(mod, "_pull_into_test_cache"):
            mod._pull_into_test_cache = _pull
