#version 450
#extension GL_GOOGLE_include_directive : require
#define REDUCE_ARGMAX
#define PREP_T uint
#define RESULT_IGNORES_INPUT
#include "common/reduction.glsl"

// DML_ACTIVATION_HARDMAX(1)_OPERATOR_DESC: 1 at the row's arg-max, 0 elsewhere. The arg-max is numpy's
// (and ONNX's reference Hardmax): the lowest in-row index of the maximum, or of the first NaN if the row
// has one; the in-row index runs over the reduced axes in dimension order.
uint prepare(STATE_T total) { return pick_index(total); }

REAL_T result(REAL_T x, uint index, uint argmax) {   // FLOAT64 too: REAL_T double
    return index == argmax ? REAL_T(1.0) : REAL_T(0.0);
}
