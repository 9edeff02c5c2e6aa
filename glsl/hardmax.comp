#version 450
#extension GL_GOOGLE_include_directive : require
#define REDUCE_ARGMAX
#define PREP_T uint
#define RESULT_IGNORES_INPUT
#include "common/reduction.glsl"

// DML_ACTIVATION_HARDMAX(1)_OPERATOR_DESC: 1 at the row's arg-max, 0 elsewhere. The arg-max is numpy's
// (and ONNX's reference Hardmax): the lowest in-row index of the maximum, or of the first NaN if the row
// has one; the in-row index runs over the reduced axes in dimension order.
uint prepare(STATE_T total) { return ARG_INDEX(total); }

VAL_T result(VAL_T x, uint index, uint argmax) {  // VAL_T: float, or double (FLOAT64)
    return index == argmax ? VAL_T(1) : VAL_T(0);
}
