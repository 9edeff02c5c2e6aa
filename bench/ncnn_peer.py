"""ncnn (PyPI ``ncnn``) with its Vulkan compute on vkact's device: ncnn's own activation layers.

The Python binding exposes no device buffer (``VkMat``) nor command buffer, only ``Extractor``, which
uploads the input, runs the layers and downloads the output in one submission. So the kernel time is
taken as a difference: a net of 1 + ``chain(n)`` copies of the layer against a net of 1, run side by
side, over ``chain(n)`` (the marginal cost of one dispatch in ncnn's own command stream, barriers included,
without the transfers or the submission that both nets pay). The layers of the longer net see the
earlier layers' outputs, not the input; the accuracy column is taken from the single layer.
fp16 and bf16 storage, packing and arithmetic are turned off: ncnn computes in float32."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.operators import OperatorDesc

from .vulkan_peers import Bound



def chain(n: int) -> int:
    """Layers beyond the first: enough that they move ~1 GiB (8 at 2^24 FLOAT32 elements, 32 at 2^20),
    since ncnn's transfers, which both nets pay, cost several kernels' time and vary from run to run."""
    return max(8, min(32, 2**30 // (8 * n)))

# vkact operator -> (ncnn layer type, its ParamDict text from the descriptor's scalars), where ncnn
# has a layer of the same formula; None where the descriptor's parameters leave ncnn's formula.
LAYERS: dict[str, Callable[[OperatorDesc], tuple[str, str] | None]] = {
    "relu": lambda op: ("ReLU", ""),
    "leaky_relu": lambda op: ("ReLU", f"0={op.Alpha!r}"),
    "sigmoid": lambda op: ("Sigmoid", ""),
    "tanh": lambda op: ("TanH", ""),
    "elu": lambda op: ("ELU", f"0={op.Alpha!r}"),
    "celu": lambda op: ("CELU", f"0={op.Alpha!r}"),
    "scaled_elu": lambda op: ("SELU", f"0={op.Alpha!r} 1={op.Gamma!r}"),
    "hard_sigmoid": lambda op: ("HardSigmoid", f"0={op.Alpha!r} 1={op.Beta!r}"),
    "hard_swish": lambda op: ("HardSwish", f"0={op.Alpha!r} 1={op.Beta!r}"),
    "swish": lambda op: ("Swish", "") if op.SigmoidInputScale == 1.0 else None,
    "softplus": lambda op: ("Softplus", "") if op.Steepness == 1.0 else None,
    "gelu": lambda op: ("GELU", "0=0"),   # 0: erf, not the tanh approximation
    "shrink": lambda op: ("Shrink", f"0={op.Bias!r} 1={op.Threshold!r}"),
}


def version() -> str | None:
    try:
        from importlib.metadata import version as v

        import ncnn  # noqa: F401 - importable, not only listed

        return f"ncnn {v('ncnn')}"
    except Exception:  # noqa: BLE001 - not installed: the column says so
        return None


def _param(layer: str, params: str, n: int, k: int) -> str:
    lines = ["7767517", f"{k + 1} {k + 1}", f"Input in 0 1 b0 0={n}"]
    lines += [f"{layer} l{i} 1 1 b{i} b{i + 1} {params}".rstrip() for i in range(k)]
    return "\n".join(lines) + "\n"


class NcnnPeer:
    name = "ncnn"

    def __init__(self) -> None:
        self._index: int | None = None

    def version(self) -> str | None:
        return version()

    def open(self, device_name: str) -> str | None:
        """None once vkact's device is found among ncnn's, else why not."""
        import ncnn

        names = [ncnn.get_gpu_info(i).device_name() for i in range(ncnn.get_gpu_count())]
        if device_name not in names:
            return f"ncnn sees no {device_name} (its Vulkan devices: {', '.join(names) or 'none'})"
        self._index = names.index(device_name)
        return None

    def _net(self, layer: str, params: str, n: int, k: int):
        import ncnn

        net = ncnn.Net()
        opt = net.opt
        opt.use_vulkan_compute = True
        opt.use_fp16_packed = opt.use_fp16_storage = opt.use_fp16_arithmetic = False
        opt.use_bf16_packed = opt.use_bf16_storage = False
        opt.num_threads = 1   # the host side of its transfers only; the CPUs are shared
        net.set_vulkan_device(self._index)
        if net.load_param_mem(_param(layer, params, n, k)) != 0:
            raise RuntimeError(f"ncnn refused a {layer} net")
        net.load_model(ncnn.DataReaderFromEmpty())
        cpu = [lay.type for lay in net.layers() if lay.type != "Input" and not lay.support_vulkan]
        if cpu:
            raise RuntimeError(f"ncnn has no Vulkan kernel for {cpu[0]} (it would run on the CPU)")
        return net

    def bind(self, name: str, op: OperatorDesc, x: np.ndarray) -> Bound | None:
        import ncnn

        spec = LAYERS[name](op) if name in LAYERS else None
        if spec is None:
            return None
        mat = ncnn.Mat(x)
        extra = chain(x.size)
        nets = {k: self._net(*spec, x.size, k) for k in (1, 1 + extra)}

        def extract(k: int) -> Callable[[], object]:
            def run() -> object:
                ex = nets[k].create_extractor()
                ex.input("b0", mat)
                ret, out = ex.extract(f"b{k}")
                if ret != 0:
                    raise RuntimeError(f"ncnn extract returned {ret}")
                return out
            return run

        single = extract(1)
        return Bound(run=extract(1 + extra), baseline=single, per=extra,
                     output=lambda: np.array(single(), dtype=np.float32).reshape(-1))
