"""mlsys.checks: the argument checks every module shares. A wrong type is a TypeError, a wrong
value a ValueError, each naming the argument, the rule and what was passed; booleans are not
integers, NaN and infinities are not numbers, NumPy scalars count like Python's."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from mlsys import checks


def test_accepted_values_come_back_as_python_numbers():
    assert checks.integer(np.int64(3), "n") == 3 and type(checks.integer(np.int64(3), "n")) is int
    assert checks.positive_int(1, "n") == 1 and checks.nonnegative_int(0, "n") == 0
    assert checks.integer(-7, "n") == -7  # no minimum: any integer
    x = checks.number(np.float32(0.5), "x")
    assert x == 0.5 and type(x) is float
    assert checks.number(4, "x", maximum=4) == 4.0  # the maximum is included
    assert checks.nonnegative(0, "x") == 0.0 and checks.positive(1e-300, "x") == 1e-300
    assert checks.fraction(1, "mfu") == 1.0  # (0, 1]: one included
    assert checks.int_sequence([2, 3], "shape") == (2, 3)
    assert checks.int_sequence((0, -1), "shape", minimum=None) == (0, -1)
    assert checks.positive_ints(batch=2, seq=3) is None
    mode = "b"
    assert checks.choice(mode, "mode", ("a", "b")) is mode
    config = SimpleNamespace(d_model=8, n_layers=2)
    assert checks.attributes(config, "cfg", ["d_model", "n_layers"], example="a config") is None


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: checks.integer(True, "n"), TypeError, "^n must be an integer, got True$"),
        (lambda: checks.integer(2.0, "n"), TypeError, r"^n must be an integer, got 2.0 \(float\)$"),
        (lambda: checks.integer("3", "n"), TypeError, r"got '3' \(str\)"),
        (lambda: checks.positive_int(0, "n_devices"), ValueError,
         "^n_devices must be a positive integer, got 0$"),
        (lambda: checks.nonnegative_int(-1, "n"), ValueError,
         "^n must be an integer >= 0, got -1$"),
        (lambda: checks.integer(3, "n", minimum=5), ValueError, "n must be an integer >= 5, got 3"),
        (lambda: checks.positive_ints(batch=2, seq=0), ValueError,
         "^seq must be a positive integer, got 0$"),
        (lambda: checks.number(True, "x"), TypeError, "x must be a real number, got True"),
        (lambda: checks.number("1", "x"), TypeError, r"x must be a real number, got '1' \(str\)"),
        (lambda: checks.number(math.nan, "x"), ValueError, "^x must be finite, got nan$"),
        (lambda: checks.number(-math.inf, "x"), ValueError, "^x must be finite, got -inf$"),
        (lambda: checks.number(5, "x", maximum=4), ValueError, "^x must be <= 4, got 5.0$"),
        (lambda: checks.number(1, "x", minimum=2), ValueError, "^x must be >= 2, got 1.0$"),
        (lambda: checks.positive(0.0, "lr"), ValueError, "^lr must be > 0, got 0.0$"),
        (lambda: checks.nonnegative(-1e-9, "x"), ValueError, "^x must be >= 0, got -1e-09$"),
        (lambda: checks.fraction(0.0, "mfu"), ValueError, "^mfu must be > 0, got 0.0$"),
        (lambda: checks.fraction(1.5, "mfu"), ValueError, "^mfu must be <= 1, got 1.5$"),
        (lambda: checks.int_sequence("23", "shape"), TypeError,
         r"shape must be a sequence of integers such as \(2, 3\), got '23'"),
        (lambda: checks.int_sequence(23, "shape"), TypeError, "shape must be a sequence"),
        (lambda: checks.int_sequence((2, -1), "shape"), ValueError,
         r"^shape\[1\] must be an integer >= 0, got -1$"),
        (lambda: checks.int_sequence((2, 1.5), "shape"), TypeError,
         r"^shape\[1\] must be an integer"),
        (lambda: checks.choice("c", "mode", ("a", "b")), ValueError,
         "^mode='c' is not one of 'a', 'b'$"),
        (lambda: checks.choice([1], "mode", ["a", "b"]), ValueError,  # unhashable: no option
         r"^mode=\[1\] is not one of 'a', 'b'$"),
        (lambda: checks.attributes(SimpleNamespace(d_model=8), "cfg", ["d_model", "n_layers"],
                                   example="a TransformerConfig"), TypeError,
         r"^cfg needs a 'n_layers' attribute \(a TransformerConfig\), got SimpleNamespace$"),
    ],
)
def test_refusals_name_the_argument_the_rule_and_the_value(call, error, message):
    with pytest.raises(error, match=message):
        call()
