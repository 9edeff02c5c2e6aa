#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_PARAMETRIC_SOFTPLUS_OPERATOR_DESC { Alpha, Beta }: Alpha * log(1 + exp(Beta * x)).
// PARAM(0..5) = Beta, -head_f(|Beta|), -(|Beta| - head_f(|Beta|)), Alpha * Beta (the slope where
// Beta * x > 0), and Alpha * 2^-64 in two factors: see softplus_f.
float activate(float x) {
    return softplus_f(x, PARAM(0), PARAM(1), PARAM(2), PARAM(3), PARAM(4), PARAM(5));
}
