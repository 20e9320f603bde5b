"""The operator registry: (domain, op_type) -> opset range, targets, converter to Relax.

Every node of a model is checked here before anything is converted, and every
unsupported node is reported in one error.  Converters can be added or overridden per
domain and opset without patching TVM:

    >>> from compiler import registry
    >>> @registry.register_op("com.example", "SoftmaxV2", since=1)
    ... def softmax_v2(bb, inputs, attrs, ctx):
    ...     x = inputs[0]
    ...     ...  # Relax ops
    ...     return relax.op.nn.softmax(x, axis=attrs.get("axis", -1))

A converter takes ``(bb, inputs, attrs, ctx)``: the Relax BlockBuilder, the node's inputs
as Relax expressions (None for an omitted optional input), its attributes as a dict, and
a :class:`ConvertContext` (node, opset of its domain, the importer's tensor map), and
returns a Relax expression (or a Tuple for several outputs).  ``register_te_op`` takes a
TE compute function instead.

Overrides are explicit: registering a converter for an opset range that an entry of the
same (domain, op) already covers raises :class:`RegistrationError` unless the call says
``override=True``; the new entry then records the one it replaces (``OpEntry.replaces``),
and the converter can delegate to it with :func:`previous`.  Which converter wins never
depends on the order modules are imported in, only on what each registration says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

ALL_TARGETS = ("x86_64", "aarch64", "cuda")
DEFAULT_DOMAIN = "ai.onnx"


def _norm_domain(domain: str) -> str:  # "" and "ai.onnx" are the same domain
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


def first_version(op_type: str, opset: int) -> int | None:
    """The first opset of default-domain ``op_type`` when it has no definition at
    ``opset`` but a later one (LayerNormalization, since 17, in an opset-14 model), else
    None.  Such a node can mean only that first version; onnxruntime runs it."""
    import onnx

    try:
        onnx.defs.get_schema(op_type, opset)
        return None
    except onnx.defs.SchemaError:
        pass
    try:
        newest = onnx.defs.get_schema(op_type, onnx.defs.onnx_opset_version())
    except onnx.defs.SchemaError:
        return None  # not an ONNX op at all: the checker names it
    for version in range(opset + 1, newest.since_version + 1):
        try:
            return onnx.defs.get_schema(op_type, version).since_version
        except onnx.defs.SchemaError:
            continue
    return None


def node_opset(domain: str, op_type: str, opset: int) -> int:
    """The opset a node is read at: its domain's opset in the model, or for a default-domain
    op first defined after it, that first version (``first_version``; the loader has
    accepted it with a warning, ``compiler/frontend/lenient.py``)."""
    if _norm_domain(domain) != DEFAULT_DOMAIN or opset is None:
        return opset
    return first_version(op_type, opset) or opset


@dataclass(frozen=True)
class ConvertContext:
    """What a converter may need beyond its inputs and attributes."""

    node: object            # the onnx.NodeProto
    opset: int              # the model's opset for the node's domain
    tensors: dict           # ONNX tensor name -> Relax expression converted so far
    params: dict            # the importer's params map (TVM converters take it)
    importer: object = None  # the importer (control flow converts subgraphs with it)
    label: str = ""          # how errors name the node (subgraph nodes: with their parents)


class RegistrationError(ValueError):
    """A registration that clashes with an existing entry (or overrides nothing)."""


@dataclass
class OpEntry:
    """One registered implementation of an ONNX operator for an opset range."""

    domain: str
    op_type: str
    since: int
    until: int | None
    converter: Callable
    targets: tuple = ALL_TARGETS
    implementation: str = "onnxc"   # "tvm" (TVM's frontend converter), "onnxc", "custom"
    doc: str = ""
    # the entry this one overrides (registered with override=True), else None
    replaces: "OpEntry | None" = field(default=None, repr=False, compare=False)

    def covers(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)

    def opsets(self) -> str:
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"

    def overlaps(self, other: "OpEntry") -> bool:
        """Some opset is covered by both entries."""
        return ((self.until is None or other.since <= self.until)
                and (other.until is None or self.since <= other.until))


@dataclass
class OperatorRegistry:
    """Entries keyed by (domain, op_type); an override (``add(..., override=True)``) takes
    precedence over the entries it overlaps."""

    entries: dict = field(default_factory=dict)   # (domain, op) -> [OpEntry], newest last

    def add(self, entry: OpEntry, override: bool = False) -> OpEntry:
        """Register ``entry``.

        Raises :class:`RegistrationError` if an existing entry of the same (domain, op)
        covers one of its opsets and ``override`` is false, or if ``override`` is true and
        there is nothing to override.  An override records the newest entry it overlaps as
        ``entry.replaces``.
        """
        entry.domain = _norm_domain(entry.domain)
        versions = self.entries.setdefault((entry.domain, entry.op_type), [])
        clash = [e for e in versions if e.overlaps(entry)]
        what = f"{entry.domain}:{entry.op_type} (opsets {entry.opsets()})"
        if clash and not override:
            raise RegistrationError(
                f"{what} is already registered ("
                + ", ".join(f"{e.implementation} {e.opsets()}" for e in clash)
                + "): pass override=True to replace it")
        if override and not clash:
            raise RegistrationError(f"{what}: override=True, but no registered converter "
                                    "covers these opsets")
        entry.replaces = clash[-1] if clash else None
        versions.append(entry)
        return entry

    def previous(self, converter: Callable) -> Callable:
        """The converter that ``converter``'s registration overrode (to delegate to).

        Raises KeyError if ``converter`` is not registered or overrode nothing."""
        for versions in self.entries.values():
            for e in versions:
                if e.converter is converter and e.replaces is not None:
                    return e.replaces.converter
        raise KeyError(f"{getattr(converter, '__qualname__', converter)} overrides no "
                       "registered converter")

    def lookup(self, domain: str, op_type: str, opset: int) -> OpEntry | None:
        """The newest entry covering ``opset``, or None."""
        for e in reversed(self.entries.get((_norm_domain(domain), op_type), [])):
            if e.covers(opset):
                return e
        return None

    def versions(self, domain: str, op_type: str) -> list[OpEntry]:
        return list(self.entries.get((_norm_domain(domain), op_type), []))

    def check(self, model, target_arch: str | None = None) -> list[dict]:
        """One dict per node no entry supports: node, op, domain, model opset, supported."""
        opsets = {_norm_domain(o.domain): o.version for o in model.opset_import}
        problems = []
        for name, node in _nodes_with_subgraphs(model.graph):
            domain = _norm_domain(node.domain)
            opset = node_opset(domain, node.op_type, opsets.get(domain))
            versions = self.versions(domain, node.op_type)
            entry = self.lookup(domain, node.op_type, opset) if opset is not None else None
            why = ""
            if opset is None:
                why = f"the model imports no opset for domain {domain!r}"
            elif not versions:
                why = "no converter is registered"
            elif entry is None:
                why = f"opset {opset} is outside {', '.join(e.opsets() for e in versions)}"
            elif target_arch and target_arch not in entry.targets:
                why = f"not available for target {target_arch}"
            if why:
                problems.append({"node": name, "op": node.op_type, "domain": domain,
                                 "opset": opset,
                                 "supported": [e.opsets() for e in versions], "why": why})
        return problems

    def table(self) -> list[OpEntry]:
        """The newest entry of every (domain, op), sorted by domain then op."""
        return [v[-1] for _, v in sorted(self.entries.items())]


def _nodes_with_subgraphs(graph, parent: str = ""):
    """(display name, node) of every node, those of If/Loop/Scan bodies included (named
    ``parent > node``), in graph order."""
    for i, node in enumerate(graph.node):
        name = parent + (node.name or f"#{i} ({node.op_type})")
        yield name, node
        for a in node.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _nodes_with_subgraphs(g, f"{name} > ")


REGISTRY = OperatorRegistry()


def register_op(domain: str, op_type: str, since: int = 1, until: int | None = None,
                targets=ALL_TARGETS, implementation: str = "custom", registry=None,
                override: bool = False):
    """Decorator: register ``fn(bb, inputs, attrs, ctx) -> relax.Expr`` for an op.

    Replacing a registered converter (even TVM's, of a default-domain op) for opsets it
    covers needs ``override=True``, else :class:`RegistrationError`; ``previous(fn)`` is
    then the converter it replaced.
    """

    def wrap(fn):
        (registry or REGISTRY).add(OpEntry(domain, op_type, since, until, fn, tuple(targets),
                                           implementation, (fn.__doc__ or "").strip()),
                                   override=override)
        return fn

    return wrap


def register_te_op(domain: str, op_type: str, compute: Callable, since: int = 1,
                   until: int | None = None, targets=ALL_TARGETS, registry=None,
                   attrs: tuple = (), override: bool = False):
    """Register an op implemented by a TE compute: ``compute(*te_tensors, **attrs)``.

    ``attrs`` names the node attributes passed to ``compute`` as keyword arguments;
    ``override`` as for :func:`register_op`.
    """

    def convert(bb, inputs, node_attrs, ctx):
        kwargs = {k: node_attrs[k] for k in attrs if k in node_attrs}
        return bb.emit_te(compute, *[x for x in inputs if x is not None],
                          primfunc_name_hint=f"{op_type.lower()}", **kwargs)

    (registry or REGISTRY).add(OpEntry(domain, op_type, since, until, convert, tuple(targets),
                                       "custom (TE)", (compute.__doc__ or "").strip()),
                               override=override)
    return compute


def previous(converter: Callable) -> Callable:
    """The converter that ``converter`` (registered with ``override=True``) replaced."""
    return REGISTRY.previous(converter)


def tvm_converter(op_type: str) -> Callable:
    """TVM's converter for a default-domain op, whatever overrides it since."""
    for e in REGISTRY.versions(DEFAULT_DOMAIN, op_type):
        if e.implementation == "tvm":
            return e.converter
    raise KeyError(f"TVM has no converter for {op_type}")


def _register_tvm_converters(registry: OperatorRegistry) -> None:
    """The default domain: TVM 0.27's ONNX frontend converters, one entry per op."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    for op_type, cls in _get_convert_map().items():
        versions = sorted(int(d.replace("_impl_v", "")) for d in dir(cls) if "_impl_v" in d)
        if not versions:
            continue

        def convert(bb, inputs, attrs, ctx, _cls=cls):
            return _cls.get_converter(ctx.opset)(bb, inputs, attrs, [ctx.tensors, ctx.params])

        # TVM picks the newest _impl_vN <= opset, and the oldest below that: every opset
        # from 1 up is handled by some implementation.
        registry.add(OpEntry(DEFAULT_DOMAIN, op_type, 1, None, convert, ALL_TARGETS, "tvm",
                             f"TVM frontend {cls.__name__} (impl v{', v'.join(map(str, versions))})"))


_register_tvm_converters(REGISTRY)
