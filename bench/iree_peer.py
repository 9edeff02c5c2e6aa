"""IREE (``iree-base-compiler``, ``iree-base-runtime``; ``pip install '.[bench]'``) compiling the same
elementwise chain for the same Vulkan device: one ``linalg.generic`` per node (IREE fuses them
itself), compiled for ``vulkan-spirv`` and run on the ``vulkan`` driver with the input already on the
device; the timed call is the invocation (which waits for its result), no host transfer."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The nodes' formulas with the scalars bench/graphs.py gives them (DirectML's defaults, LINEAR 0.5, 0.1).
BODIES = {
    "LINEAR": ["%c1 = arith.constant 0.5 : f32", "%c2 = arith.constant 0.1 : f32", "%m = arith.mulf %a, %c1 : f32", "%r = arith.addf %m, %c2 : f32"],
    "RELU": ["%z = arith.constant 0.0 : f32", "%r = arith.maximumf %a, %z : f32"],
    "SHRINK": ["%t = arith.constant 0.5 : f32", "%nt = arith.constant -0.5 : f32", "%z = arith.constant 0.0 : f32",
               "%lo = arith.cmpf olt, %a, %nt : f32", "%hi = arith.cmpf ogt, %a, %t : f32",
               "%s = arith.select %hi, %a, %z : f32", "%r = arith.select %lo, %a, %s : f32"],
    "LEAKY_RELU": ["%z = arith.constant 0.0 : f32", "%al = arith.constant 0.01 : f32", "%m = arith.mulf %a, %al : f32",
                   "%ge = arith.cmpf oge, %a, %z : f32", "%r = arith.select %ge, %a, %m : f32"],
    "SCALED_TANH": ["%be = arith.constant 0.5 : f32", "%m = arith.mulf %a, %be : f32", "%r = math.tanh %m : f32"],
    "SIGMOID": ["%one = arith.constant 1.0 : f32", "%n = arith.negf %a : f32", "%e = math.exp %n : f32",
                "%d = arith.addf %one, %e : f32", "%r = arith.divf %one, %d : f32"],
    "ELU": ["%z = arith.constant 0.0 : f32", "%e = math.expm1 %a : f32", "%ge = arith.cmpf oge, %a, %z : f32", "%r = arith.select %ge, %a, %e : f32"],
    "SOFTSIGN": ["%one = arith.constant 1.0 : f32", "%ab = math.absf %a : f32", "%d = arith.addf %one, %ab : f32", "%r = arith.divf %a, %d : f32"],
    "HARD_SIGMOID": ["%al = arith.constant 0.2 : f32", "%be = arith.constant 0.5 : f32", "%z = arith.constant 0.0 : f32", "%one = arith.constant 1.0 : f32",
                     "%m = arith.mulf %a, %al : f32", "%s = arith.addf %m, %be : f32", "%lo = arith.minimumf %s, %one : f32", "%r = arith.maximumf %lo, %z : f32"],
    "THRESHOLDED_RELU": ["%one = arith.constant 1.0 : f32", "%z = arith.constant 0.0 : f32", "%gt = arith.cmpf ogt, %a, %one : f32", "%r = arith.select %gt, %a, %z : f32"],
    "IDENTITY": ["%zz = arith.constant -0.0 : f32", "%r = arith.addf %a, %zz : f32"],   # x + (-0) is x, bit for bit
}


def version() -> str | None:
    try:
        from importlib.metadata import version as v

        return f"iree-base-compiler {v('iree-base-compiler')}, iree-base-runtime {v('iree-base-runtime')}"
    except Exception:  # noqa: BLE001 - not installed: the column says so
        return None


def mlir(kinds: list[str], n: int, bodies: dict[str, list[str]] = BODIES) -> str:
    t = f"tensor<{n}xf32>"
    lines = [f"func.func @chain(%v0: {t}) -> {t} {{"]
    for i, kind in enumerate(kinds):
        body = bodies[kind]
        lines += [
            f"  %e{i} = tensor.empty() : {t}",
            f"  %v{i + 1} = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], "
            f'iterator_types = ["parallel"]}} ins(%v{i} : {t}) outs(%e{i} : {t}) {{',
            "  ^bb0(%a: f32, %o: f32):",
            *(f"    {b}" for b in body),
            "    linalg.yield %r : f32",
            f"  }} -> {t}",
        ]
    lines += [f"  return %v{len(kinds)} : {t}", "}"]
    return "\n".join(lines) + "\n"


class IreeChain:
    """A compiled chain on IREE's Vulkan driver: ``run`` (timed) and ``output`` (the last result on the host)."""

    def __init__(self, kinds: list[str], x: np.ndarray, bodies: dict[str, list[str]] = BODIES) -> None:
        import iree.compiler as ic
        import iree.runtime as rt

        self._rt = rt
        vmfb = ic.compile_str(mlir(kinds, x.size, bodies), target_backends=["vulkan-spirv"])
        self.config = rt.Config("vulkan")
        ctx = rt.SystemContext(config=self.config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        self._f = ctx.modules.module["chain"]
        self._x = rt.asdevicearray(self.config.device, x)
        self._last = None

    def run(self) -> None:
        self._last = self._f(self._x)

    def output(self) -> np.ndarray:
        """The last result, copied to a page-aligned host array (IREE's own to_host imports an unaligned
        numpy array, which its Vulkan driver refuses: minImportedHostPointerAlignment)."""
        rt = self._rt
        source = self._last._buffer_view.get_buffer()
        n = source.byte_length()
        raw = np.empty(n + 8192, np.uint8)
        start = (-raw.ctypes.data) % 4096
        result = raw[start : start + n + (-n % 4096)]
        device = self.config.device
        usage = int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_PERSISTENT)
        host = device.allocator.import_host_allocation(result, memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE), allowed_usage=usage)
        sem = device.create_semaphore(0)
        device.queue_copy(source, host, wait_semaphores=rt.HalFence.create_at(sem, 0), signal_semaphores=rt.HalFence.create_at(sem, 1))
        rt.HalFence.create_at(sem, 1).wait()
        return result[:n].view(np.float32).copy()


def chain(kinds: list[str], x: np.ndarray) -> tuple[Callable[[], None], Callable[[], np.ndarray]] | None:
    """(run, output) for IREE's compiled chain, or None where IREE or its Vulkan driver is missing."""
    if version() is None:
        return None
    peer = IreeChain(kinds, x)
    return peer.run, peer.output
