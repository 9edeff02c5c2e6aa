"""wgpu (PyPI ``wgpu``: wgpu-native) on vkact's device: one WGSL compute shader per operator, the same
formula with the descriptor's scalars, over ``vec4<f32>`` (16 bytes per invocation, as vkact's units).

The adapter is the one whose backend is Vulkan and whose device is vkact's (wgpu also offers the same
llvmpipe through OpenGL: never that one). Timed: encode one dispatch, submit, wait for the queue
(wgpu-native's ``wgpuDevicePoll`` with wait, through the device's ``_poll_wait``: wgpu 0.32's
``queue.on_submitted_work_done_sync`` passes wgpu-native a callback of the wrong type and raises); the
buffers stay on the device."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.operators import OperatorDesc

from .vulkan_peers import Bound

WORKGROUP = 256
MAX_GROUPS = 65535   # WebGPU's maxComputeWorkgroupsPerDimension default: 2^26 elements would need 65,536


def _f(value: float) -> str:
    """A WGSL literal of the float32 that the device gets (an abstract float, converted exactly)."""
    return f"{float(np.float32(value))!r}"


# vkact operator -> WGSL expression of v (vec4<f32>); vkact's formulas with the descriptor's scalars.
ZERO, ONE = "vec4<f32>(0.0)", "vec4<f32>(1.0)"
EXPRESSIONS: dict[str, Callable[[OperatorDesc], str | None]] = {
    "relu": lambda op: f"max(v, {ZERO})",
    "leaky_relu": lambda op: f"select(v * {_f(op.Alpha)}, v, v >= {ZERO})",
    "sigmoid": lambda op: "1.0 / (1.0 + exp(-v))",
    "tanh": lambda op: "tanh(v)",
    "elu": lambda op: f"select({_f(op.Alpha)} * (exp(v) - 1.0), v, v >= {ZERO})",
    "celu": lambda op: f"max(v, {ZERO}) + min({ZERO}, {_f(op.Alpha)} * (exp(v / {_f(op.Alpha)}) - 1.0))",
    "scaled_elu": lambda op: f"{_f(op.Gamma)} * select({_f(op.Alpha)} * (exp(v) - 1.0), v, v > {ZERO})",
    "hard_sigmoid": lambda op: f"clamp({_f(op.Alpha)} * v + {_f(op.Beta)}, {ZERO}, {ONE})",
    "hard_swish": lambda op: f"v * clamp({_f(op.Alpha)} * v + {_f(op.Beta)}, {ZERO}, {ONE})",
    "swish": lambda op: f"v / (1.0 + exp(-{_f(op.SigmoidInputScale)} * v))",
    "softplus": lambda op: f"log(1.0 + exp({_f(op.Steepness)} * v)) / {_f(op.Steepness)}",
    "softsign": lambda op: "v / (1.0 + abs(v))",
    "shrink": lambda op: (f"select(select({ZERO}, v - {_f(op.Bias)}, v > vec4<f32>({_f(op.Threshold)})), "
                          f"v + {_f(op.Bias)}, v < vec4<f32>({_f(-op.Threshold)}))"),
    "scaled_tanh": lambda op: f"{_f(op.Alpha)} * tanh({_f(op.Beta)} * v)",
    "linear": lambda op: f"{_f(op.Alpha)} * v + {_f(op.Beta)}",
    "thresholded_relu": lambda op: f"select({ZERO}, v, v > vec4<f32>({_f(op.Alpha)}))",
}
# GELU is x * Phi(x): WGSL has no erf, so wgpu has no like-for-like kernel.


def shader(expression: str) -> str:
    return f"""
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;

@compute @workgroup_size({WORKGROUP})
fn main(@builtin(global_invocation_id) id: vec3<u32>) {{
    let i = id.x;
    if (i >= arrayLength(&y)) {{ return; }}
    let v = x[i];
    y[i] = {expression};
}}
"""


def version() -> str | None:
    try:
        from importlib.metadata import version as v

        import wgpu  # noqa: F401 - importable (its wgpu-native library loads), not only listed

        return f"wgpu {v('wgpu')}"
    except Exception:  # noqa: BLE001 - not installed: the column says so
        return None


class WgpuPeer:
    name = "wgpu"

    def __init__(self) -> None:
        self._device = None
        self._buffers: tuple[int, object, object] | None = None   # (elements, input, output)

    def version(self) -> str | None:
        return version()

    def open(self, device_name: str) -> str | None:
        """None once wgpu's Vulkan adapter for vkact's device is open, else why not."""
        import wgpu

        adapters = wgpu.gpu.enumerate_adapters_sync()
        for adapter in adapters:
            if adapter.info["backend_type"] == "Vulkan" and adapter.info["device"] == device_name:
                self._device = adapter.request_device_sync()
                return None
        seen = ", ".join(f"{a.info['device']} ({a.info['backend_type']})" for a in adapters) or "none"
        return f"wgpu offers no Vulkan adapter for {device_name} (its adapters: {seen})"

    def _io(self, x: np.ndarray) -> tuple[object, object]:
        """The input (x, uploaded once) and output buffers for this many elements, shared by the operators."""
        import wgpu

        if self._buffers is None or self._buffers[0] != x.size:
            self._buffers = None   # release the previous size's before allocating
            device = self._device
            src = device.create_buffer_with_data(data=x, usage=wgpu.BufferUsage.STORAGE)
            dst = device.create_buffer(size=x.nbytes, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
            self._buffers = (x.size, src, dst)
        return self._buffers[1], self._buffers[2]

    def bind(self, name: str, op: OperatorDesc, x: np.ndarray) -> Bound | None:
        expression = EXPRESSIONS[name](op) if name in EXPRESSIONS else None
        if expression is None or x.size % (4 * WORKGROUP) or x.size // (4 * WORKGROUP) > MAX_GROUPS:
            return None
        device = self._device
        src, dst = self._io(x)
        pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": device.create_shader_module(code=shader(expression)), "entry_point": "main"})
        group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": src, "offset": 0, "size": src.size}},
            {"binding": 1, "resource": {"buffer": dst, "offset": 0, "size": dst.size}},
        ])
        groups = x.size // (4 * WORKGROUP)

        def run() -> None:
            encoder = device.create_command_encoder()
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(groups)
            compute.end()
            device.queue.submit([encoder.finish()])
            device._poll_wait()   # wgpuDevicePoll(wait): until the queue is idle (see the module's note)

        return Bound(run=run, output=lambda: np.frombuffer(device.queue.read_buffer(dst), np.float32).copy())
