"""The MLServer side of ``bench/v2.py``: SHRINK in numpy as an MLServer custom runtime.

Loaded by ``mlserver start`` from the bench's own virtual environment (``.cache/bench-mlserver-venv``),
never by vkact's: MLServer pins its own fastapi, pydantic and uvicorn. The bench copies this file next to
the ``settings.json`` and ``model-settings.json`` it writes, so that MLServer imports it as
``mlserver_model.Shrink``.

DirectML's SHRINK with its defaults (Bias 0, Threshold 0.5), in float32:
``x + Bias`` where ``x < -Threshold``, ``x - Bias`` where ``x > Threshold``, else 0."""
from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

BIAS = np.float32(0.0)
LAMBD = np.float32(0.5)


def shrink(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    zero = np.float32(0)
    return np.where(x < -LAMBD, x + BIAS, np.where(x > LAMBD, x - BIAS, zero)).astype(np.float32, copy=False)


class Shrink(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        request_input = next((i for i in payload.inputs if i.name == "InputTensor"), None)
        if request_input is None:
            raise ValueError("the request has no input named InputTensor")
        x = NumpyCodec.decode_input(request_input)
        y = shrink(x)
        output = NumpyCodec.encode_output(name="OutputTensor", payload=y)
        output.shape = list(y.shape)  # NumpyCodec would add a batch dimension to a 1-D tensor: [n] -> [n, 1]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=[output])
