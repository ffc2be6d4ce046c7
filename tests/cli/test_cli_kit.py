"""transformer_lab/cli: the one-line parser and the option types every command shares."""
import argparse

import pytest

from transformer_lab.cli import (EXIT_USAGE, OneLineParser, int_at_least, non_empty_path,
                                 non_negative_int, number_at_least, positive_int)


def parser():
    p = OneLineParser(prog="tool")
    p.add_argument("question", nargs="?")
    p.add_argument("--steps", metavar="N", type=positive_int)
    p.add_argument("--arch", choices=("llama", "gpt2"))
    p.add_argument("--lr", type=number_at_least(0, exclusive=True))
    p.add_argument("--quick", action="store_true")
    return p


def usage_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(argv)
    assert info.value.code == EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: error: ")
    return err.strip()


def test_the_valid_options_come_from_the_parser():
    assert parser().valid_options() == "[question], --steps N, --arch llama|gpt2, --lr LR, --quick"


def test_an_unknown_option_lists_the_valid_ones(capsys):
    assert usage_error(["a", "--bogus"], capsys) == (
        "tool: error: unrecognized arguments: --bogus (valid options: [question], --steps N, "
        "--arch llama|gpt2, --lr LR, --quick; --help for more)")


def test_a_bad_value_names_its_option_only(capsys):
    err = usage_error(["--steps", "0"], capsys)
    assert err == "tool: error: argument --steps: must be >= 1, got 0"
    assert "valid options" not in usage_error(["--arch", "bert"], capsys)


def test_usage_error_is_the_line_as_given(capsys):
    with pytest.raises(SystemExit) as info:
        parser().usage_error("--warmup (10) must be smaller than --steps (10)")
    assert info.value.code == 2
    assert capsys.readouterr().err == "tool: error: --warmup (10) must be smaller than --steps (10)\n"


@pytest.mark.parametrize("argv, given", [
    ([], set()), (["--steps", "5"], {"steps"}), (["--steps=5"], {"steps"}),
    (["--ste", "5", "--quick"], {"steps", "quick"}),  # an abbreviation counts as given
    (["q", "--arch", "gpt2"], {"question", "arch"}),
])
def test_given_names_what_the_command_line_set(argv, given):
    p = parser()
    assert p.given(argv) == given
    assert p.parse_args([]).steps is None and p.parse_args([]).quick is False  # defaults back


def test_int_types():
    assert positive_int("3") == 3 and non_negative_int("0") == 0 and int_at_least(-2)("-2") == -2
    for parse, text, message in [(positive_int, "0", "must be >= 1, got 0"),
                                 (non_negative_int, "-1", "must be >= 0, got -1"),
                                 (positive_int, "2.5", "expected an integer, got '2.5'"),
                                 (positive_int, "many", "expected an integer, got 'many'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
            parse(text)


def test_number_types():
    assert number_at_least(0)("0") == 0.0 and number_at_least(0, exclusive=True)("1e-3") == 1e-3
    for parse, text, message in [(number_at_least(0), "-1", "must be a finite number >= 0, got -1"),
                                 (number_at_least(0, exclusive=True), "0",
                                  "must be a finite number > 0, got 0"),
                                 (number_at_least(0), "nan", "must be a finite number >= 0, got nan"),
                                 (number_at_least(0), "inf", "must be a finite number >= 0, got inf"),
                                 (number_at_least(0), "x", "expected a number, got 'x'")]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{message}$"):
            parse(text)


def test_non_empty_path():
    assert non_empty_path("model.gguf") == "model.gguf"
    with pytest.raises(argparse.ArgumentTypeError, match=r"the path is empty \(''\)"):
        non_empty_path("")
