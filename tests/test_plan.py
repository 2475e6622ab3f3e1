"""The compute path planned once (specdec/plan.py): what each combination of flags resolves to, and
the combinations that cannot go together, decided before any model loads."""

import pytest

from specdec.errors import SpecdecError
from specdec.plan import make_plan


def test_a_drafter_on_the_blocks_makes_the_target_float32_on_its_float_weights():
    plan = make_plan("smollm2-135m", ["self-q4"])
    assert (plan.weights, plan.load_dtype, plan.dtype_choice) == ("float", "float32", "auto")
    assert plan.drafters == ("self-q4",)


def test_flags_given_are_kept_and_gguf_files_load_in_float32():
    plan = make_plan("smollm2-135m", ["prompt-lookup"], dtype="bfloat16", weights="float", backend="transformers")
    assert (plan.weights, plan.load_dtype, plan.backend) == ("float", "bfloat16", "transformers")
    assert make_plan("model.gguf").load_dtype == "float32"  # a .gguf file's blocks take float32 activations
    assert make_plan("model.gguf", dtype="bfloat16").load_dtype == "bfloat16"  # refused when it loads, by name
    assert make_plan("smollm2-135m", weights="q8_0").load_dtype == "float32"  # requantised blocks: float32 too


@pytest.mark.parametrize("kwargs,needle", [
    (dict(target="smollm2-135m", weights="int3"), "unknown weights"),
    (dict(target="model.gguf", drafters=["self-q4"]), "no float weights"),
])
def test_flags_that_cannot_go_together_are_refused_before_loading(kwargs, needle):
    with pytest.raises(SpecdecError, match=needle):
        make_plan(**kwargs)
