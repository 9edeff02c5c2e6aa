"""IREE (``iree-base-compiler``, ``iree-base-runtime``; ``pip install '.[bench]'``) compiling the same
elementwise chain for the same Vulkan device: one ``linalg.generic`` per node (IREE fuses them
itself), compiled for ``vulkan-spirv`` and run on the ``vulkan`` driver with the input already on the
device; the timed call is the invocation (which waits for its result), no host transfer.

Without the compiler (the GPU machine, where it cannot travel), VKACT_IREE_AOT names a folder of the
same programs compiled ahead of time (bench/iree_aot.py), which ``iree-base-runtime`` alone loads."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import iree_aot

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


def _installed(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version as v

    try:
        return v(package)
    except PackageNotFoundError:
        return None


def version() -> str | None:
    """IREE as the bench uses it, or None where it cannot run (not installed; no compiler and no
    VKACT_IREE_AOT folder)."""
    runtime, compiler = _installed("iree-base-runtime"), _installed("iree-base-compiler")
    if runtime is None:
        return None
    if compiler is not None:
        return f"iree-base-compiler {compiler}, iree-base-runtime {runtime}"
    aot = iree_aot.folder()
    return None if aot is None else f"iree-base-runtime {runtime}, modules {iree_aot.describe(aot)}"


def module(text: str) -> bytes | None:
    """``text`` compiled for vulkan-spirv: by the compiler where installed, else from the VKACT_IREE_AOT
    folder (None where that has no such module)."""
    if _installed("iree-base-compiler") is not None:
        import iree.compiler as ic

        return ic.compile_str(text, target_backends=[iree_aot.BACKEND])
    aot = iree_aot.folder()
    return None if aot is None else iree_aot.load(aot, text)


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

    def __init__(self, vmfb: bytes, x: np.ndarray, device: dict) -> None:
        """On ``device``, one of the driver's query_available_devices() (see ``device``)."""
        import iree.runtime as rt

        self._rt = rt
        # the runtime's cached device (by URI, its path the device's UUID): one destroyed with the
        # interpreter in another order, as a create_device one is, segfaults at exit
        self.config = rt.Config(device=rt.get_device(f"vulkan://{device['path']}"))
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


def device(name: str) -> dict | None:
    """IREE's Vulkan device that is vkact's ``name`` (its names append the driver's: "llvmpipe (LLVM
    15.0.6, 256 bits) (llvmpipe Mesa 22.3.6 (LLVM 15.0.6))"), or None where it sees none: a machine
    with a GPU may list a CPU driver too, and in any order."""
    import iree.runtime as rt

    return next((d for d in rt.get_driver("vulkan").query_available_devices() if d["name"].startswith(name)), None)


def devices() -> str:
    import iree.runtime as rt

    return ", ".join(d["name"] for d in rt.get_driver("vulkan").query_available_devices()) or "none"


def chain(kinds: list[str], x: np.ndarray, device_name: str) -> tuple[Callable[[], None], Callable[[], np.ndarray]] | None:
    """(run, output) for IREE's compiled chain on vkact's device ``device_name``, or None where IREE, a
    module compiled ahead of time for this chain and size, or that device is missing."""
    if version() is None:
        return None
    vmfb = module(mlir(kinds, x.size))
    on = device(device_name) if vmfb is not None else None
    if on is None:
        return None
    peer = IreeChain(vmfb, x, on)
    return peer.run, peer.output
