"""validate.py: "an int, but not a bool", checked in one place, with the argument named."""
import numpy as np
import pytest

from transformer_lab.validate import check_int, is_int


@pytest.mark.parametrize("value", [0, 7, -3, np.int64(5), np.int8(-1), np.uint16(9)])
def test_ints_and_numpy_ints_are_ints(value):
    assert is_int(value)
    got = check_int(value, "n")
    assert got == value and type(got) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 2.0, np.float32(3), "3", None,
                                   [1], 1 + 0j])
def test_bools_floats_and_others_are_not(value):
    assert not is_int(value)
    with pytest.raises(ValueError) as info:
        check_int(value, "steps")
    assert str(info.value) == f"steps must be an int, got {value!r}"


def test_bounds_and_their_default_wording():
    assert check_int(0, "step", low=0) == 0 and check_int(4, "k", low=1, high=4) == 4
    with pytest.raises(ValueError, match=r"^step must be an int >= 0, got -1$"):
        check_int(-1, "step", low=0)
    with pytest.raises(ValueError, match=r"^k must be an int <= 3, got 4$"):
        check_int(4, "k", high=3)
    with pytest.raises(ValueError, match=r"^top_k must be an int in \[1, 8\], got 9$"):
        check_int(9, "top_k", low=1, high=8)
    # A bool is refused before the bounds are looked at: True is not a count of 1.
    with pytest.raises(ValueError, match=r"^k must be an int in \[1, 8\], got True$"):
        check_int(True, "k", low=1, high=8)


def test_a_caller_can_word_the_requirement():
    with pytest.raises(ValueError, match=r"^KVCache: batch must be a positive int, got 0$"):
        check_int(0, "KVCache: batch", low=1, what="a positive int")


def test_the_package_reports_through_it():
    from transformer_lab import Config, cosine_lr, get_task
    with pytest.raises(ValueError, match=r"^Config.d_model must be an int >= 1, got True$"):
        Config(vocab=8, d_model=True, n_heads=1, n_layers=1, d_ff=4, max_seq=4)
    with pytest.raises(ValueError, match=r"^warmup must be an int >= 0, got 1.0$"):
        cosine_lr(0, max_lr=1.0, warmup=1.0, total=4)
    with pytest.raises(ValueError, match=r"^digits must be an int >= 1, got False$"):
        get_task("addition", digits=False)
