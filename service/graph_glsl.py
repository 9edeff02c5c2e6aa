"""GLSL for a fused group of elementwise graph nodes: one shader, one read of each tensor it needs,
one write of each value used outside it.

Each node's formula is its operator's own ``glsl/<kernel>.comp`` (the text after its includes), pasted
once per kernel with ``activate`` renamed to ``activate_<kernel>``; the formulas read PARAM(i) from the
globals param0..5 as under glsl/common/elementwise.glsl, and the generated main sets those from the
node's slot of a parameter buffer before each call (after inlining, the driver sees plain values).

Bit-identity with the node-by-node run: that run stores every node's result as its data type's bits
and the next node loads them. Here every value a node passes on goes through ``rounded`` (ROUNDED):
the value that store and load give (FLOAT16: rounded to a half's precision and range), with its bits
OR-ed with a push constant that is always 0. The OR is opaque to the driver's compiler, so it cannot
contract one node's last product into the next node's sum (an fma rounds once where the node-by-node
run rounds twice).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

PARAM_WORDS = 6   # PARAM(0..5) per node, as in elementwise.glsl's push constants

#: ``rounded(v, zero)``: v as the node-by-node run stores it and the next node loads it. FLOAT32: the
#: bits OR-ed with the opaque zero. FLOAT16: from_bits(to_bits(v)) is f16_to_f32(f32_to_f16(v)), two
#: branchy bit-exact conversions per node and element; the same value comes from float arithmetic:
#: adding m = 2^(e + 13) (e: v's exponent, at least -14, below which halves are subnormal with step
#: 2^-24) leaves |v| rounded to nearest-even at the half's step (2^(e - 10)), subtracting m is exact;
#: at 65520 and above a half is infinite; a NaN keeps the 10 payload bits a half keeps, made quiet.
ROUNDED = {
    "F32": "ELEM_T rounded(ELEM_T v, uint zero) { return from_bits(to_bits(v) | zero); }",
    "F16": """float rounded(float v, uint zero) {
    uint x = floatBitsToUint(v) | zero;
    uint a = x & 0x7fffffffu;
    float m = uintBitsToFloat(max(a & 0x7f800000u, 0x38800000u) + (13u << 23));
    precise float r = (uintBitsToFloat(a) + m) - m;
    uint y = a >= 0x477ff000u ? (a > 0x7f800000u ? (a & 0x7fffe000u) | 0x00400000u : 0x7f800000u) : floatBitsToUint(r);
    return uintBitsToFloat(y | (x & 0x80000000u));
}""",
}


@dataclass(frozen=True)
class FusedNode:
    kernel: str                  # glsl/<kernel>.comp
    args: tuple[str, ...]        # GLSL names of its inputs: "x<i>" (a read tensor) or "v<n>" (a node)
    result: str                  # "v<n>"


@dataclass(frozen=True)
class FusedKernel:
    """The inputs of the generator: which buffers are read and written, and the nodes in order."""

    dtype: str                   # DataTypeInfo.shader, e.g. "F16"
    reads: int                   # tensors read: x0 .. x<reads-1>
    nodes: tuple[FusedNode, ...]
    writes: tuple[str, ...]      # values stored, in binding order after the reads


@cache
def formula(glsl_dir: Path, kernel: str) -> str:
    """The operator's formula: its .comp less the version, extension and include lines."""
    lines = (glsl_dir / f"{kernel}.comp").read_text().splitlines()
    body = [ln for ln in lines if not ln.startswith(("#version", "#extension", "#include"))]
    return "\n".join(body).strip() + "\n"


@dataclass(frozen=True)
class Prologue:
    """Elementwise nodes before a softmax-family node, fused into its loads: they read ``reads``
    tensors (x0: the reduction's own input binding, the others after its parameter buffer), all laid
    out as the reduction's input, and the last node's value is what the reduction reads."""

    reads: int
    nodes: tuple[FusedNode, ...]


def _formulas(glsl_dir: Path, nodes: tuple[FusedNode, ...]) -> list[str]:
    out: list[str] = []
    for k in dict.fromkeys(n.kernel for n in nodes):
        out += [f"// ---- glsl/{k}.comp", f"#define activate activate_{k}", formula(glsl_dir, k), "#undef activate"]
    return out


def _node_calls(nodes: tuple[FusedNode, ...], first_word: int) -> list[str]:
    """The nodes applied in order, their scalars from prm[] from ``first_word`` on, each value but the
    last rounded (OR-ed with ``zero``) as the node-by-node run stores and reloads it."""
    out = []
    for n, node in enumerate(nodes):
        out.append("    " + " ".join(f"param{w} = prm[{first_word + n * PARAM_WORDS + w}];" for w in range(PARAM_WORDS)))
        out.append(f"    ELEM_T {node.result} = activate_{node.kernel}({', '.join(node.args)});")
        if n < len(nodes) - 1:
            out.append(f"    {node.result} = rounded({node.result}, zero);")
    return out


def _prologue(dtype: str, layout: str, prologue: Prologue, zero_word: int, params_binding: int) -> list[str]:
    """prologue_word and prologue_unit (reduction.glsl's PROLOGUE hooks): the inputs' words at the
    place asked for, each element through the nodes, stored as the last node's data type stores it."""
    reads = range(prologue.reads)
    packed = layout == "PACKED"
    out = [
        f"layout(binding = {params_binding + i}) readonly buffer PrologueIn{i} {{ {'uvec4' if packed else 'uint'} in{i}_{'units' if packed else 'words'}[]; }};"
        for i in reads if i > 0
    ]
    args = ", ".join(f"ELEM_T x{i}" for i in reads)
    out += [f"ELEM_T prologue_value({args}, uint zero) {{", *_node_calls(prologue.nodes, 0), f"    return {prologue.nodes[-1].result};", "}"]
    words = ", ".join(f"uint a{i}" for i in reads)
    out.append(f"uint prologue_apply({words}) {{")
    out.append(f"    uint zero = prm[{zero_word}];")
    if dtype == "F32":
        out.append(f"    return to_bits(prologue_value({', '.join(f'from_bits(a{i})' for i in reads)}, zero)) | zero;")
    else:   # two 16-bit elements per word, each on its own
        lo = ", ".join(f"from_bits(a{i} & 0xffffu)" for i in reads)
        hi = ", ".join(f"from_bits(a{i} >> 16)" for i in reads)
        out.append(f"    return (to_bits(prologue_value({lo}, zero)) | (to_bits(prologue_value({hi}, zero)) << 16)) | zero;")
    out.append("}")
    word = (lambda i: "IN_WORD_RAW(w)" if i == 0 else (f"in{i}_units[w >> 2][w & 3u]" if packed else f"in{i}_words[w]"))
    out += ["uint prologue_word(uint w) {", f"    return prologue_apply({', '.join(word(i) for i in reads)});", "}"]
    out.append("uvec4 prologue_unit(uint u) {")
    if packed:
        out += [f"    uvec4 a{i} = {'in_units' if i == 0 else f'in{i}_units'}[u];" for i in reads]
        out.append("    return uvec4(" + ", ".join(f"prologue_apply({', '.join(f'a{i}.{c}' for i in reads)})" for c in "xyzw") + ");")
    else:   # the strided layout reads words only
        out.append("    return uvec4(prologue_word(4u * u), prologue_word(4u * u + 1u), prologue_word(4u * u + 2u), prologue_word(4u * u + 3u));")
    out.append("}")
    return out


def generate_reduction(reduction: str, dtype: str, layout: str, unroll: int, prologue: Prologue | None,
                       epilogue: tuple[FusedNode, ...], glsl_dir: Path) -> str:
    """A softmax-family kernel (glsl/<reduction>.comp over common/reduction.glsl) with elementwise nodes
    fused into it.

    Prologue: every read of its input goes through the prologue's nodes (reduction.glsl's PROLOGUE
    hooks), the last node's value rounded to its data type's bits as the node-by-node run stores it;
    the reduction reads its input twice (the sweep that reduces, the one that writes), so the prologue
    is computed twice per element: the same bits both times.

    Epilogue: every result is passed, rounded to its data type as the node-by-node run stores it,
    through the nodes (reading "x0", the reduction's result, and each other) before it is stored: the
    operator's ``result`` is renamed and wrapped.

    The nodes' scalars come from a parameter buffer after the kernel's own bindings (the prologue's
    nodes, then the epilogue's, then a word 0: the opaque zero of ``rounded``); the prologue's inputs
    other than the first follow it."""
    params_binding = 2 if layout == "PACKED" else 3
    nodes = (*(prologue.nodes if prologue else ()), *epilogue)
    zero_word = len(nodes) * PARAM_WORDS
    source = (glsl_dir / f"{reduction}.comp").read_text().splitlines()
    include = next(i for i, ln in enumerate(source) if ln.startswith('#include "common/reduction.glsl"'))
    body = [ln for ln in source[:include + 1] if not ln.startswith(("#version", "#extension"))]
    parts = [f"{len(prologue.nodes)} prologue node(s)"] if prologue else []
    parts += [f"{len(epilogue)} epilogue node(s)"] if epilogue else []
    out = [
        "#version 450",
        "#extension GL_GOOGLE_include_directive : require",
        f"// generated by service/graph_glsl.py: glsl/{reduction}.comp with {' and '.join(parts)} fused",
        f"#define DTYPE_{dtype}",
        f"#define LAYOUT_{layout}",
        f"#define UNROLL {unroll}",
        *(["#define PROLOGUE"] if prologue else []),
        *body,
        '#include "common/numerics.glsl"',
    ]
    if epilogue:
        out.append("#define result result_reduction")
    out += [*source[include + 1:]]
    if epilogue:
        out.append("#undef result")
    out += [
        f"layout(binding = {params_binding}) readonly buffer Params {{ uint prm[]; }};",
        "uint param0, param1, param2, param3, param4, param5;",
        "#define PARAM(i) uintBitsToFloat(param##i)",
        "#define PARAM_INT(i) int(param##i)",
        "#define PARAM_UINT(i) param##i",
        ROUNDED[dtype],
        *_formulas(glsl_dir, nodes),
    ]
    if prologue:
        out += _prologue(dtype, layout, prologue, zero_word, params_binding)
    if epilogue:
        out += [
            "float result(float x, uint index, PREP_T p) {",
            f"    uint zero = prm[{zero_word}];",
            "    ELEM_T x0 = rounded(result_reduction(x, index, p), zero);",
            *_node_calls(epilogue, len(prologue.nodes) * PARAM_WORDS if prologue else 0),
            f"    return {epilogue[-1].result};",
            "}",
        ]
    out.append("")
    return "\n".join(out)


def generate(kernel: FusedKernel, glsl_dir: Path) -> str:
    """The fused shader's GLSL (compiled with glsl_dir on the include path)."""
    reads, writes = kernel.reads, len(kernel.writes)
    out: list[str] = [
        "#version 450",
        "#extension GL_GOOGLE_include_directive : require",
        f"// generated by service/graph_glsl.py: {len(kernel.nodes)} fused node(s)",
        f"#define DTYPE_{kernel.dtype}",
        '#include "common/dtype.glsl"',
        '#include "common/numerics.glsl"',
        "layout(local_size_x_id = 0) in;",
        "layout(push_constant) uniform Push { uint count; uint zero; } pc;",
        "uint param0, param1, param2, param3, param4, param5;",
        "#define PARAM(i) uintBitsToFloat(param##i)",
        "#define PARAM_INT(i) int(param##i)",
        "#define PARAM_UINT(i) param##i",
        "layout(binding = 0) readonly buffer Params { uint prm[]; };",
    ]
    out += [f"layout(binding = {1 + i}) readonly buffer In{i} {{ uvec4 in{i}[]; }};" for i in range(reads)]
    out += [f"layout(binding = {1 + reads + j}) writeonly buffer Out{j} {{ uvec4 out{j}[]; }};" for j in range(writes)]
    out += [
        "// A value as the node-by-node run stores and reloads it; zero (pc.zero, 0 at run time) keeps the",
        "// driver from fusing across. Copied out of the push constants once: lavapipe reloads them at every use.",
        "uint zero;",
        ROUNDED[kernel.dtype],
    ]
    out += _formulas(glsl_dir, kernel.nodes)

    slots = [f"n{n}_p{w}" for n in range(len(kernel.nodes)) for w in range(PARAM_WORDS)]
    out.append(f"uint {', '.join(slots)};")
    out += ["void main() {", "    zero = pc.zero;"]
    out += [f"    n{n}_p{w} = prm[{n * PARAM_WORDS + w}];" for n in range(len(kernel.nodes)) for w in range(PARAM_WORDS)]
    out += [
        "    uint units = (pc.count + UNIT_ELEMS - 1u) / UNIT_ELEMS;",
        "    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;",
        "    for (uint u = gl_GlobalInvocationID.x; u < units; u += step) {",
    ]
    out += [f"        uvec4 r{i} = in{i}[u];" for i in range(reads)]
    out += _unit_body(kernel)
    out += ["    }", "}", ""]
    return "\n".join(out)


#: Elements in one 32-bit word, per fused data type.
ELEMS_PER_WORD = {"F32": 1, "F16": 2}


def _unit_body(kernel: FusedKernel) -> list[str]:
    """One 16-byte unit of every read tensor through the nodes, node-major: each node over all of the
    unit's elements (4 FLOAT32, 8 FLOAT16; a loop over an array), then the next node. The elements'
    chains are independent; side by side, a CPU driver's out-of-order core overlaps them.
    Element-major (one element's whole chain, then the next's: ~130 dependent vector instructions
    per element for the exp/tanh chain of 4) it waited on one chain's latencies at a time. Measured
    on the exp/tanh chain of 4, alternated rounds, bit-identical answers: element-major ran 1.33x as
    long on llvmpipe (FLOAT32, 2^24 elements, load 2.9; FLOAT16 1.26x), 3.1x on SwiftShader (2^22).
    The loop, not one call per element: llvmpipe unrolls it (the same speed as the calls written
    out), SwiftShader keeps it, whose compiler took over 20 GB building a 32-node chain written out
    (MAX_FUSED_NODES) and ran the chain of 4 written out 1.5x as fast as the loop."""
    per_word = ELEMS_PER_WORD[kernel.dtype]
    size = 4 * per_word
    places = [(c, k) for c in "xyzw" for k in range(per_word)]   # element e of the unit: word c, slot k
    extract = (lambda i, c, k: f"from_bits(r{i}.{c})") if per_word == 1 else \
        (lambda i, c, k: f"from_bits(bitfieldExtract(r{i}.{c}, {k * 16}, 16))")
    out = [f"        ELEM_T x{i}[{size}] = ELEM_T[]({', '.join(extract(i, c, k) for c, k in places)});" for i in range(kernel.reads)]
    out += [f"        ELEM_T {node.result}[{size}];" for node in kernel.nodes]
    stored = set(kernel.writes)
    for n, node in enumerate(kernel.nodes):
        out.append("        " + " ".join(f"param{w} = n{n}_p{w};" for w in range(PARAM_WORDS)))
        args = ", ".join(f"{a}[e]" for a in node.args)
        out.append(f"        for (int e = 0; e < {size}; ++e) {node.result}[e] = activate_{node.kernel}({args});")
        if node.result in stored:
            j = kernel.writes.index(node.result)
            bits = [f"to_bits({node.result}[{e}])" for e in range(size)]
            words = bits if per_word == 1 else [f"bitfieldInsert({bits[2 * w]}, {bits[2 * w + 1]}, 16, 16)" for w in range(4)]
            out.append(f"        out{j}[u] = uvec4({', '.join(words)});")
        if n < len(kernel.nodes) - 1:
            out.append(f"        for (int e = 0; e < {size}; ++e) {node.result}[e] = rounded({node.result}[e], zero);")
    return out
