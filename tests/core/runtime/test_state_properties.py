"""Fingerprints of any tensor (hypothesis): empty and 0-d tensors, non-contiguous views, every dtype kvaudit
may meet in a state (floats, float8, integers, bool); equal tensors have equal fingerprints and any change of
one element, of the dtype or of the shape changes it; ULP distances count neighbouring floats as 1."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_kvaudit.core.runtime.state import fingerprint_tensors  # noqa: E402
from pytest_kvaudit.core.runtime.state.tensors import first_position, ulps  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, *(d for d in (getattr(torch, "float8_e4m3fn", None),
                                                 getattr(torch, "float8_e5m2", None)) if d is not None)]
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


def make(shape: tuple[int, ...], dtype: object, seed: int) -> object:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 255, shape, generator=g, dtype=torch.int64)
    if dtype == torch.bool:
        return raw % 2 == 1
    if dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
        return (raw % 100).to(dtype)
    return (raw.to(torch.float32) / 17.0 - 7.0).to(dtype)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, dtype=st.sampled_from(DTYPES), seed=st.integers(0, 10_000))
def test_equal_tensors_equal_fingerprints_any_dtype_and_shape(shape: tuple[int, ...], dtype: object, seed: int) -> None:
    a = make(shape, dtype, seed)
    assert fingerprint_tensors([a]) == fingerprint_tensors([a.clone()])
    if a.numel():
        b = a.clone().reshape(-1)
        v = b[0].to(torch.float32)  # doubled, or 0 -> 1: never rounds back to itself (x + 1 did: 8 in float8_e5m2)
        b[0] = (~b[0]) if dtype == torch.bool else (v * 2 if v != 0 else v + 1).to(dtype)
        assert fingerprint_tensors([a]) != fingerprint_tensors([b.reshape(shape)])


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=st.integers(0, 10_000))
def test_dtype_and_shape_are_part_of_the_fingerprint(shape: tuple[int, ...], seed: int) -> None:
    a = make(shape, torch.float32, seed)
    assert fingerprint_tensors([a]) != fingerprint_tensors([a.view(torch.int32)])
    assert fingerprint_tensors([a]) != fingerprint_tensors([a.reshape(-1, 1)]) or a.dim() == 2 and a.shape[1] == 1


def test_zero_dim_empty_and_non_contiguous_tensors() -> None:
    counter = torch.tensor(7)
    assert fingerprint_tensors([counter]) == fingerprint_tensors([torch.tensor(7)])
    assert fingerprint_tensors([counter]) != fingerprint_tensors([torch.tensor(8)])
    empty = torch.empty(1, 2, 0, 4)
    assert fingerprint_tensors([empty]) == fingerprint_tensors([torch.zeros(1, 2, 0, 4)])
    assert fingerprint_tensors([empty]) != fingerprint_tensors([torch.empty(1, 2, 0, 5)])
    base = torch.arange(24.0).reshape(2, 3, 4)
    view = base.transpose(0, 2)  # non-contiguous
    assert not view.is_contiguous()
    assert fingerprint_tensors([view]) == fingerprint_tensors([view.contiguous()])


@settings(max_examples=40, deadline=None)
@given(x=st.floats(-1e4, 1e4, allow_nan=False, width=32), dtype=st.sampled_from([torch.float32, torch.bfloat16,
                                                                                    torch.float16]))
@example(x=-1.401298464324817e-45, dtype=torch.bfloat16)  # rounds to -0.0: its neighbour is below it in magnitude order
def test_neighbouring_floats_are_one_ulp_apart(x: float, dtype: object) -> None:
    a = torch.tensor([x], dtype=dtype)
    b = torch.nextafter(a.float(), torch.tensor([float("inf")])).to(dtype) if dtype == torch.float32 else None
    if b is None:  # the next representable value of a half type away from zero: one more in its magnitude bits
        # (sign-magnitude, so +1 on the bits for either sign; x itself may round to -0.0, whose neighbour is
        # the smallest negative subnormal, never the bits below it, which are a NaN)
        bits = a.view(torch.int16)
        b = (bits + 1).view(dtype)
    assert int(ulps(a, b)[0]) == 1
    assert int(ulps(torch.tensor([0.0]), torch.tensor([-0.0]))[0]) == 0


def test_first_position_is_the_first_differing_position() -> None:
    a = torch.zeros(1, 2, 5, 3)
    b = a.clone()
    b[0, 1, 3, 2] = 1.0
    assert first_position(a, b, positional=True) == 3
    assert first_position(a, a, positional=True) is None
