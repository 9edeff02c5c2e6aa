"""Host-side halves of glsl/common/numerics.glsl: parameters split the way the kernels need them."""
from __future__ import annotations

import numpy as np

#: The largest finite float32, for host-computed factors that would otherwise overflow to inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def f32(value: float) -> float:
    """``value`` as the DirectML FLOAT the kernel receives (round to nearest float32)."""
    return float(np.float32(value))


#: The smallest normal float32: a kernel may flush anything smaller in magnitude to zero (D3D12 and
#: Vulkan let fp32 denormals flush), so a divisor below it is zero on some devices.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def flush_subnormal(value: float) -> float:
    """float32(value), a subnormal one as a zero of its sign: what a kernel's parameter is on every
    device (service/engine.py sends parameters so; the references use them so)."""
    v = f32(value)
    return float(np.copysign(0.0, v)) if abs(v) < FLOAT32_TINY else v


def finite_float32(value: float) -> float:
    """``value`` (finite) checked as a parameter: refused where, as the float32 the kernel receives, it is an
    infinity (the kernel would compute with it; an integer kernel's set-up truncates it and fails)."""
    with np.errstate(over="ignore"):
        rounded = f32(value)
    if np.isinf(rounded):
        raise ValueError(f"{value!r} is past DirectML's FLOAT (float32) range: it must round to a float32 of magnitude at most {FLOAT32_MAX:.8g}")
    return value


def divisor(name: str, value: float) -> float:
    """``value`` checked as a parameter the formula divides by: refused when zero on a device, that is
    0 as a float32 or subnormal (some devices flush those, where the reference would not)."""
    if abs(f32(value)) < FLOAT32_TINY:
        raise ValueError(f"{name} must not be 0, nor smaller in magnitude than {FLOAT32_TINY:.7g} (the formula divides by it)")
    return value


def split(value: float) -> tuple[float, float]:
    """float32(value) as head + tail, both exact float32s: the head keeps the 12 leading significand
    bits (numerics.glsl head_f), the tail the rest, so a kernel can form exact products with them."""
    v = np.float32(value)
    head = (v.view(np.uint32) & np.uint32(0xFFFFF000)).view(np.float32)
    return float(head), float(v - head)


def mul_add_params(a: float, b: float) -> tuple[float, float, float, float]:
    """PARAM(0..3) for numerics.glsl mul_add_f(x, a, head, tail, b)."""
    head, tail = split(a)
    return (f32(a), head, tail, f32(b))


def scale_params(s: float) -> tuple[float, float, float]:
    """s, and -head and -tail of |s|: what numerics.glsl softplus_f (and swish.comp) need to form
    -|s * x| exactly as a head and a tail."""
    head, tail = split(abs(f32(s)))
    return (f32(s), -head, -tail)


def softplus_params(s: float, scale: float, slope: float) -> tuple[float, ...]:
    """PARAM(0..5) for numerics.glsl softplus_f: scale_params(s), the slope of the linear part
    (scale * s, clamped to the float32 range so that 0 * slope stays 0), and scale * 2^-64 as two
    factors that neither overflow nor flush early: (scale * 2^-64, 1) for |scale| >= 1, else
    (scale, 2^-64). (1 / Steepness may exceed the float32 range: the product then overflows to inf,
    as the result does.)"""
    factors = (scale * 2.0**-64, 1.0) if abs(scale) >= 1.0 else (scale, 2.0**-64)
    return (*scale_params(s), _finite(slope), *(_finite(f) for f in factors))


def _finite(value: float) -> float:
    return float(np.clip(value, -FLOAT32_MAX, FLOAT32_MAX))
