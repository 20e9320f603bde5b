"""onnxc's converters for ai.onnx.ml ops (Binarizer, ArrayFeatureExtractor, TreeEnsemble)
and the default-domain TfIdfVectorizer and RoiAlign's ``max`` mode (DeformConv is in
nn.py).

Each follows ONNX's reference implementation (``onnx/reference/ops``), written with Relax
ops or, where those lack the op, a TE compute.  Whatever is not implemented is refused with
an ``UnsupportedError`` naming the node.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from tvm import relax

from .common import (register, refuse, static_shape, np_dtype, scalar, dtype_of, is_float,
                     attr_text, tensor_const, refuse_attribute)
from ..registry import previous, register_op

ML = "ai.onnx.ml"


def _register_ml(op, since=1):
    return register_op(ML, op, since=since, implementation="onnxc")




def _tensor_attr(ctx, name):
    """A tensor attribute's value as numpy, or None."""
    for a in ctx.node.attribute:
        if a.name == name:
            return numpy_helper.to_array(a.t)
    return None


# --------------------------------------------------------------------------- #
# Binarizer, ArrayFeatureExtractor
# --------------------------------------------------------------------------- #


@_register_ml("Binarizer")
def binarizer(bb, inputs, attrs, ctx):
    """Binarizer: 1 where x > threshold, else 0, in x's type."""
    x = inputs[0]
    dtype = dtype_of(x)
    threshold = float(attrs.get("threshold", 0.0))
    if not is_float(dtype):
        threshold_v = scalar(threshold, "float64")
        return relax.op.astype(relax.op.greater(relax.op.astype(x, "float64"), threshold_v),
                               dtype)
    return relax.op.astype(relax.op.greater(x, scalar(threshold, dtype)), dtype)


@_register_ml("ArrayFeatureExtractor")
def array_feature_extractor(bb, inputs, attrs, ctx):
    """ArrayFeatureExtractor: data[..., indices] over the last axis (all indices, flattened);
    a 1-D input gives a (1, k) output as onnxruntime and the reference do.  Out-of-range
    indices are clamped (the reference raises)."""
    x, idx = inputs[0], inputs[1]
    dims = static_shape(x)
    k = int(np.prod(static_shape(idx))) if static_shape(idx) else 1
    flat = relax.op.reshape(idx, [k])
    if dtype_of(idx) != "int64":
        flat = relax.op.astype(flat, "int64")
    out = relax.op.take(x, flat, axis=len(dims) - 1, mode="clip")
    if len(dims) == 1:
        out = relax.op.reshape(out, [1, k])
    return out


# --------------------------------------------------------------------------- #
# TreeEnsemble (ai.onnx.ml 5)
# --------------------------------------------------------------------------- #

_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)


@_register_ml("TreeEnsemble", since=5)
def tree_ensemble(bb, inputs, attrs, ctx):
    """TreeEnsemble: every root-to-leaf path of every tree is one column; a sample reaches
    a path when all its branch conditions hold (a count compared with the path length),
    and the reached leaves' weights are aggregated per target (SUM, AVERAGE, MIN, MAX).
    post_transform must be NONE."""
    x = inputs[0]
    dtype = dtype_of(x)
    if not is_float(dtype):
        refuse(ctx, f"input of type {dtype}")
    dims = static_shape(x)
    if len(dims) != 2:
        refuse(ctx, f"input of shape {dims} ((N, F) expected)")
    if int(attrs.get("post_transform", 0)) != 0:
        refuse(ctx, f"post_transform={attrs.get('post_transform')}")
    agg = int(attrs.get("aggregate_function", 1))
    if agg not in (0, 1, 2, 3):
        refuse(ctx, f"aggregate_function={agg}")
    splits = _tensor_attr(ctx, "nodes_splits")
    modes = _tensor_attr(ctx, "nodes_modes")
    weights = _tensor_attr(ctx, "leaf_weights")
    members = _tensor_attr(ctx, "membership_values")
    feat = list(attrs["nodes_featureids"])
    true_ids, false_ids = list(attrs["nodes_truenodeids"]), list(attrs["nodes_falsenodeids"])
    true_leaf, false_leaf = list(attrs["nodes_trueleafs"]), list(attrs["nodes_falseleafs"])
    targets = list(attrs["leaf_targetids"])
    roots = list(attrs["tree_roots"])
    n_targets = int(attrs["n_targets"])
    missing = list(attrs.get("nodes_missing_value_tracks_true", [0] * len(feat)))
    n_nodes = len(feat)
    if min(feat, default=0) < 0 or max(feat, default=0) >= dims[1] or \
            min(targets, default=0) < 0 or max(targets, default=0) >= n_targets:
        refuse(ctx, "feature or target ids out of range")

    # set members per MEMBER node, in node order (NaN separates the sets)
    sets, it = {}, iter([] if members is None else members.tolist())
    for i in range(n_nodes):
        if int(modes[i]) == _MEMBER:
            s = []
            for v in it:
                if np.isnan(v):
                    break
                s.append(v)
            sets[i] = s

    # paths: (list of (node, took_true_branch), leaf index)
    paths = []

    def walk(node, is_leaf, path, depth):
        if depth > n_nodes:
            refuse(ctx, "a cycle in the tree structure")
        if is_leaf:
            paths.append((path, node))
            return
        walk(true_ids[node], true_leaf[node], path + [(node, True)], depth + 1)
        walk(false_ids[node], false_leaf[node], path + [(node, False)], depth + 1)

    for r in roots:
        degenerate = true_leaf[r] and false_leaf[r] and true_ids[r] == false_ids[r]
        walk(r, bool(degenerate), [], 0)

    # branch conditions: (N, nodes) booleans
    xv = bb.emit(relax.op.take(x, tensor_const(np.array(feat, np.int64)), axis=1))
    npdt = np_dtype(dtype)
    split = relax.const(splits.astype(npdt), dtype)
    cond = None
    for mode, fn in ((_LEQ, relax.op.less_equal), (_LT, relax.op.less),
                     (_GTE, relax.op.greater_equal), (_GT, relax.op.greater),
                     (_EQ, relax.op.equal), (_NEQ, relax.op.not_equal)):
        mask = np.array([int(m) == mode for m in modes])
        if not mask.any():
            continue
        term = relax.op.logical_and(fn(xv, split), relax.const(mask, "bool"))
        cond = term if cond is None else relax.op.logical_or(cond, term)
    for i, values in sets.items():
        col = relax.op.strided_slice(xv, axes=[1], begin=[i], end=[i + 1])
        hit = relax.op.equal(col, relax.const(np.array(values, npdt), dtype)) if values \
            else relax.op.zeros([dims[0], 1], "bool")
        hit = relax.op.max(relax.op.astype(hit, "int32"), axis=[1], keepdims=True)
        onehot = np.zeros((1, n_nodes), bool)
        onehot[0, i] = True
        term = relax.op.logical_and(relax.op.astype(hit, "bool"), relax.const(onehot, "bool"))
        cond = term if cond is None else relax.op.logical_or(cond, term)
    if cond is None:
        cond = relax.op.zeros([dims[0], n_nodes], "bool")
    if any(missing):
        track = relax.const(np.array([bool(m) for m in missing]), "bool")
        cond = relax.op.logical_or(cond, relax.op.logical_and(relax.op.isnan(xv), track))
    cond = bb.emit(relax.op.astype(cond, "float32"))

    # reached (N, paths): true-branch hits + false-branch misses == path length
    n_paths = len(paths)
    on_true = np.zeros((n_nodes, n_paths), np.float32)
    on_false = np.zeros((n_nodes, n_paths), np.float32)
    for p, (path, _) in enumerate(paths):
        for node, took in path:
            (on_true if took else on_false)[node, p] = 1
    length = on_true.sum(0) + on_false.sum(0)
    score = relax.op.add(relax.op.matmul(cond, tensor_const(on_true)),
                         relax.op.matmul(relax.op.subtract(scalar(1, "float32"), cond),
                                         tensor_const(on_false)))
    reached = bb.emit(relax.op.equal(score, tensor_const(length.astype(np.float32))))

    leaf_w = np.array([weights[leaf] for _, leaf in paths], dtype=np.float64)
    leaf_t = np.array([targets[leaf] for _, leaf in paths], dtype=np.int64)
    if agg in (0, 1):
        w = np.zeros((n_paths, n_targets))
        w[np.arange(n_paths), leaf_t] = leaf_w / (len(roots) if agg == 0 else 1)
        hit = relax.op.astype(reached, dtype)
        return relax.op.matmul(hit, relax.const(w.astype(npdt), dtype))
    # MIN / MAX: per target over the reached leaves, starting from the type's max / min
    finfo = np.finfo(npdt)
    init = finfo.max if agg == 2 else finfo.min
    outs = []
    for t in range(n_targets):
        cols = np.nonzero(leaf_t == t)[0]
        if cols.size == 0:
            outs.append(relax.op.full([dims[0], 1], scalar(init, dtype), dtype))
            continue
        sel = relax.op.take(reached, tensor_const(cols.astype(np.int64)), axis=1)
        vals = relax.op.where(sel, relax.const(leaf_w[cols].astype(npdt), dtype),
                              scalar(init, dtype))
        red = relax.op.min if agg == 2 else relax.op.max
        outs.append(red(vals, axis=[1], keepdims=True))
    return relax.op.concat(outs, axis=1) if len(outs) > 1 else outs[0]


# --------------------------------------------------------------------------- #
# TfIdfVectorizer (integer pools)
# --------------------------------------------------------------------------- #


@register("TfIdfVectorizer", since=9)
def tfidf_vectorizer(bb, inputs, attrs, ctx):
    """TfIdfVectorizer over integer inputs: every pool n-gram (min_gram_length..max) is
    counted at every start and skip distance (1..max_skip_count + 1; unigrams once) with
    one comparison per gram item, summed into its ngram_indexes column, then weighted
    (TF, IDF, TFIDF)."""
    x = inputs[0]
    if "pool_strings" in attrs:
        refuse(ctx, "pool_strings (string inputs)")
    if not dtype_of(x).startswith("int"):
        refuse(ctx, f"input of type {dtype_of(x)}")
    dims = static_shape(x)
    if len(dims) not in (1, 2):
        refuse(ctx, f"input of shape {dims} ([C] or [B, C])")
    mode = attr_text(attrs.get("mode"), "TF")
    if mode not in ("TF", "IDF", "TFIDF"):
        refuse(ctx, f"mode={mode!r}")
    min_n, max_n = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    max_skip = int(attrs["max_skip_count"])
    counts = list(attrs["ngram_counts"])
    indexes = list(attrs["ngram_indexes"])
    pool = list(attrs.get("pool_int64s", []))
    weights = list(attrs.get("weights", []))
    if min_n < 1 or max_n < min_n or max_skip < 0:
        refuse(ctx, f"min/max_gram_length {min_n}/{max_n}, max_skip_count {max_skip}")
    out_size = max(indexes) + 1 if indexes else 0
    if weights and len(weights) < out_size:
        refuse(ctx, f"{len(weights)} weights for {out_size} outputs")

    # grams by size: (values (G, n), output columns (G,)), ids in pool order
    grams, gram_id = {}, 0
    for i, start in enumerate(counts):
        end = counts[i + 1] if i + 1 < len(counts) else len(pool)
        n = i + 1
        k = (end - start) // n if end > start else 0
        if k and min_n <= n <= max_n:
            if gram_id + k > len(indexes):
                refuse(ctx, "fewer ngram_indexes than pool n-grams")
            vals = np.array(pool[start:start + k * n], np.int64).reshape(k, n)
            if len({tuple(v) for v in vals}) != k:
                refuse(ctx, f"repeated {n}-grams in the pool")
            grams[n] = (vals, indexes[gram_id:gram_id + k])
        gram_id += k

    x2 = x if len(dims) == 2 else relax.op.reshape(x, [1, dims[0]])
    x2 = bb.emit(relax.op.astype(x2, "int64") if dtype_of(x) != "int64" else x2)
    rows, length = (dims[0], dims[1]) if len(dims) == 2 else (1, dims[0])
    freq = None
    for n, (vals, cols) in grams.items():
        proj = np.zeros((len(cols), out_size), np.float32)
        proj[np.arange(len(cols)), cols] = 1
        total = None
        for d in ([1] if n == 1 else range(1, max_skip + 2)):
            span = length - (n - 1) * d
            if span <= 0:
                break
            match = None
            for j in range(n):
                item = relax.op.strided_slice(x2, axes=[1], begin=[j * d], end=[j * d + span])
                eq = relax.op.equal(relax.op.expand_dims(item, 2),
                                    tensor_const(vals[:, j].reshape(1, 1, -1)))
                match = eq if match is None else relax.op.logical_and(match, eq)
            c = relax.op.sum(relax.op.astype(match, "float32"), axis=[1])   # (rows, G)
            total = c if total is None else relax.op.add(total, c)
        if total is not None:
            part = relax.op.matmul(bb.emit(total), tensor_const(proj))
            freq = part if freq is None else relax.op.add(freq, part)
    if freq is None:
        freq = relax.op.zeros([rows, out_size], "float32")
    freq = bb.emit(freq)
    if mode == "IDF" or (mode == "TFIDF" and weights):
        w = np.array(weights[:out_size] if weights else [1.0] * out_size, np.float32)
        if mode == "IDF":
            present = relax.op.greater(freq, scalar(0, "float32"))
            freq = relax.op.where(present, tensor_const(w), scalar(0, "float32"))
        else:
            freq = relax.op.multiply(freq, tensor_const(w))
    return freq if len(dims) == 2 else relax.op.reshape(freq, [out_size])


# RoiAlign avg: TVM's, refusing modes TVM ignores; mode=max below replaces it
refuse_attribute("RoiAlign", "mode", lambda v: (v.decode() if isinstance(v, bytes) else v) != "avg",
             since=10)


def _roi_align_avg(bb, inputs, attrs, ctx):
    """RoiAlign mode=avg as ``relax.op.vision.roi_align`` (TVM's topi: the adaptive
    sampling grid included), the half-pixel offset applied after the spatial scale as ONNX
    says (``roi * scale - 0.5``).  TVM's converter subtracted 0.5 from the ROI before the
    scale: with spatial_scale 0.25 (a stride-4 FPN level, opset 16's default mode) every
    output was off, by up to 1.7 on unit-normal features.  An adaptive grid
    (sampling_ratio 0) over an empty or inverted ROI gives 0, as onnxruntime."""
    x, rois, batch = inputs[0], inputs[1], inputs[2]
    dtype = dtype_of(rois)
    default = "output_half_pixel" if ctx.opset < 16 else "half_pixel"
    ctm = attr_text(attrs.get("coordinate_transformation_mode"), default)
    if ctm not in ("half_pixel", "output_half_pixel"):
        refuse(ctx, f"coordinate_transformation_mode={ctm!r}")
    scale = float(attrs.get("spatial_scale", 1.0))
    aligned = ctm == "half_pixel"
    if aligned and scale != 0.0:  # topi scales the ROI: (roi - 0.5 / scale) * scale
        rois = relax.op.subtract(rois, relax.const(np.full(4, 0.5 / scale), dtype))
    index = relax.op.astype(relax.op.expand_dims(batch, axis=1), dtype)
    ratio = int(attrs.get("sampling_ratio", 0))
    out = relax.op.vision.roi_align(
        x, relax.op.concat([index, rois], axis=1),
        pooled_size=(int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))),
        spatial_scale=scale, sample_ratio=ratio, aligned=aligned, layout="NCHW", mode="avg")
    if ratio > 0 or not aligned:
        return out
    # an adaptive grid over an empty or inverted ROI has no samples: onnxruntime gives 0;
    # the empty reduction leaves its output unwritten (never initialised: garbage)
    op = relax.op
    size = bb.normalize(op.multiply(op.subtract(
        op.strided_slice(rois, axes=[1], begin=[2], end=[4]),
        op.strided_slice(rois, axes=[1], begin=[0], end=[2])), relax.const(scale, dtype)))
    positive = bb.normalize(op.astype(op.greater(size, relax.const(0.0, dtype)), "int32"))
    has = bb.normalize(op.expand_dims(op.min(positive, axis=[1], keepdims=True), [2, 3]))
    return op.where(bb.normalize(op.greater(has, relax.const(0, "int32"))),
                    bb.normalize(out), relax.const(0.0, dtype_of(x)))


# --------------------------------------------------------------------------- #
# RoiAlign mode=max
# --------------------------------------------------------------------------- #


@register("RoiAlign", since=10, override=True)
def roi_align(bb, inputs, attrs, ctx):
    """RoiAlign: mode=max as ONNX's reference computes it (the maximum, over the sampling
    grid, of the four weighted bilinear corner terms), with a fixed sampling_ratio > 0;
    mode=avg as ``_roi_align_avg``."""
    mode = attr_text(attrs.get("mode"), "avg")
    if mode != "max":
        return _roi_align_avg(bb, inputs, attrs, ctx)
    from tvm import te, tirx

    x, rois, batch = inputs[0], inputs[1], inputs[2]
    xd = static_shape(x)
    if len(xd) != 4 or static_shape(rois)[1:] != [4]:
        refuse(ctx, f"X of shape {xd} with rois of shape {static_shape(rois)}")
    dtype = dtype_of(x)
    if not is_float(dtype) or dtype_of(rois) != dtype:
        refuse(ctx, f"X of type {dtype} with rois of type {dtype_of(rois)}")
    sr = int(attrs.get("sampling_ratio", 0))
    if sr <= 0:
        refuse(ctx, "mode=max with sampling_ratio=0 (an adaptive sampling grid)")
    default = "output_half_pixel" if ctx.opset < 16 else "half_pixel"
    ctm = attr_text(attrs.get("coordinate_transformation_mode"), default)
    if ctm not in ("half_pixel", "output_half_pixel"):
        refuse(ctx, f"coordinate_transformation_mode={ctm!r}")
    half = ctm == "half_pixel"
    ph_n, pw_n = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    scale = float(attrs.get("spatial_scale", 1.0))
    _, channels, height, width = xd
    n_rois = static_shape(rois)[0]
    b64 = relax.op.astype(batch, "int64") if dtype_of(batch) != "int64" else batch

    def compute(data, r, bidx):
        def f(v):
            return tirx.const(v, dtype)

        def value(n, c, ph, pw):
            off = f(0.5 if half else 0.0)
            sw = r[n, 0] * f(scale) - off
            sh = r[n, 1] * f(scale) - off
            rw = r[n, 2] * f(scale) - off - sw
            rh = r[n, 3] * f(scale) - off - sh
            if not half:
                rw, rh = tirx.max(rw, f(1.0)), tirx.max(rh, f(1.0))
            bh, bw = rh / f(ph_n), rw / f(pw_n)
            b = tirx.max(tirx.min(bidx[n], xd[0] - 1), 0)
            best = None
            for iy in range(sr):
                for ix in range(sr):
                    y = sh + tirx.Cast(dtype, ph) * bh + f(iy + 0.5) * bh / f(sr)
                    xx = sw + tirx.Cast(dtype, pw) * bw + f(ix + 0.5) * bw / f(sr)
                    outside = tirx.any(y < f(-1.0), y > f(height), xx < f(-1.0),
                                       xx > f(width))
                    y = tirx.max(y, f(0.0))
                    xx = tirx.max(xx, f(0.0))
                    y0 = tirx.Cast("int64", y)
                    x0 = tirx.Cast("int64", xx)
                    y_edge = y0 >= height - 1
                    x_edge = x0 >= width - 1
                    y0 = tirx.Select(y_edge, tirx.const(height - 1, "int64"), y0)
                    x0 = tirx.Select(x_edge, tirx.const(width - 1, "int64"), x0)
                    y1 = tirx.Select(y_edge, y0, y0 + 1)
                    x1 = tirx.Select(x_edge, x0, x0 + 1)
                    y = tirx.Select(y_edge, tirx.Cast(dtype, y0), y)
                    xx = tirx.Select(x_edge, tirx.Cast(dtype, x0), xx)
                    ly = y - tirx.Cast(dtype, y0)
                    lx = xx - tirx.Cast(dtype, x0)
                    hy, hx = f(1.0) - ly, f(1.0) - lx
                    val = tirx.max(tirx.max(hy * hx * data[b, c, y0, x0],
                                            hy * lx * data[b, c, y0, x1]),
                                   tirx.max(ly * hx * data[b, c, y1, x0],
                                            ly * lx * data[b, c, y1, x1]))
                    val = tirx.Select(outside, f(0.0), val)
                    best = val if best is None else tirx.max(best, val)
            return best

        return te.compute([n_rois, channels, ph_n, pw_n], value, name="roi_align_max")

    return bb.emit_te(compute, x, rois, b64, primfunc_name_hint="roi_align_max")
