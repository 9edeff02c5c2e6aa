#version 450
#extension GL_GOOGLE_include_directive : require
#include "common/elementwise.glsl"

// DML_ACTIVATION_CELU_OPERATOR_DESC { Alpha }: max(0, x) + min(0, Alpha * (exp(x / Alpha) - 1)).
// PARAM(0) = Alpha, PARAM(1) = 1 / Alpha, PARAM(2), PARAM(3) = Alpha's head and tail (Celu.shader_params).
// For x > 0 the second term is 0 whatever the sign of Alpha; NaN takes the second branch and stays NaN.
// The branch on Alpha's sign is uniform (every invocation takes the same side), so each side costs
// only its own work.
float activate(float x) {
    float y = x * PARAM(1);
    if (PARAM(0) > 0.0) {  // y <= 0: exp is at most 1, and the rounding of x / Alpha barely shows
        return x > 0.0 ? x : PARAM(0) * expm1_f(y);
    }
    // Alpha < 0: y > 0 and exp amplifies its rounding y-fold, so the quotient's tail (x - y Alpha) / Alpha
    // joins the argument (y Alpha formed exactly); Alpha is folded into 2^k before exp can overflow.
    float tail = mul_add_f(y, -PARAM(0), -PARAM(2), -PARAM(3), x) * PARAM(1);
    return x > 0.0 ? x : scaled_expm1_f(y, tail, PARAM(0));
}
