"""One JSON casing on the wire: camelCase keys out, old snake_case names accepted in.

Internal Structs, DuckDB columns and stored blobs keep their snake_case names (renaming them
would break data files already written); the gateway and the export turn keys into camelCase
at the boundary, and request bodies are normalised the same way before they are decoded, so a
client that still sends `request_id` or `verdict_by` is understood.

Not every key is schema: some maps are keyed by data (a bot's `grants` by user id, a topic map
by topic name). Their keys are kept as the user chose them; only their values are walked.
Keys starting with `_` (the `_tag` of the memory command union, a contract) are kept too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

# Keys whose value is a map keyed by data (ids, names, topics), not by field names.
DATA_MAPS = frozenset(
    {
        "grants",
        "topics",
        "byTopic",
        "tokens",
        "models",
        "counts",
        "byStatus",
        "dependents",
        "parameters",
        "arguments",
        "input",
        "properties",
        "settingsByOrg",
        "bots",
        "names",
        "botNames",
        "poolNames",
        "byAccount",
        "byTable",
        "metadata",
        "files",
    }
)


@lru_cache(maxsize=4096)
def camel(key: str) -> str:
    """`created_at` → `createdAt`; camelCase, `_tag` and single words are left as they are."""
    if "_" not in key or key.startswith("_"):
        return key
    head, *rest = key.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def camel_keys(value: Any) -> Any:
    """A copy of a JSON-like value (builtins) with every schema key in camelCase."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = camel(k) if isinstance(k, str) else k
            if key in DATA_MAPS and isinstance(v, dict):
                out[key] = {dk: camel_keys(dv) for dk, dv in v.items()}
            else:
                out[key] = camel_keys(v)
        return out
    if isinstance(value, (list, tuple)):
        return [camel_keys(v) for v in value]
    return value


def to_wire(obj: Any) -> Any:
    """Structs, dataclasses and builtins as camelCase JSON-ready builtins."""
    return camel_keys(msgspec.to_builtins(obj))


@lru_cache(maxsize=4096)
def snake(key: str) -> str:
    """`toolCalls` → `tool_calls`: for inputs decoded into Structs that keep snake_case fields."""
    if key.startswith("_") or key.islower():
        return key
    return "".join("_" + c.lower() if c.isupper() else c for c in key)


def snake_keys(value: Any) -> Any:
    """A copy of a JSON-like value with camelCase keys turned back into snake_case (data maps'
    keys kept), so a Struct with snake_case fields accepts both spellings."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            key = snake(k) if isinstance(k, str) else k
            if k in DATA_MAPS and isinstance(v, dict):
                out[key] = {dk: snake_keys(dv) for dk, dv in v.items()}
            else:
                out[key] = snake_keys(v)
        return out
    if isinstance(value, list):
        return [snake_keys(v) for v in value]
    return value


def camel_schema(doc: Any) -> Any:
    """A JSON Schema / OpenAPI document describing the camelCase wire: property names and
    `required` lists in camelCase; every other key (paths, component names) as it is."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k == "properties" and isinstance(v, dict):
                out[k] = {camel(p): camel_schema(s) for p, s in v.items()}
            elif k == "required" and isinstance(v, list):
                out[k] = [camel(p) if isinstance(p, str) else p for p in v]
            elif k in ("default", "example", "examples"):
                out[k] = camel_keys(v)
            else:
                out[k] = camel_schema(v)
        return out
    if isinstance(doc, list):
        return [camel_schema(v) for v in doc]
    return doc


@lru_cache(maxsize=256)
def _info(kind: Any) -> Any:
    return msgspec.inspect.type_info(kind)


_NAMES: dict[type, dict[str, Any]] = {}


def _names(struct: Any) -> dict[str, Any]:
    """Every accepted spelling of a Struct's fields → (the name msgspec expects, its type)."""
    known = _NAMES.get(struct.cls)
    if known is not None:
        return known
    out: dict[str, Any] = {}
    for f in struct.fields:
        for spelling in (f.name, f.encode_name, camel(f.name), snake(f.encode_name)):
            out.setdefault(spelling, (f.encode_name, f.type))
    _NAMES[struct.cls] = out
    return out


def _fit(value: Any, t: Any) -> Any:
    mi = msgspec.inspect
    while isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        for option in t.types:
            o = option.type if isinstance(option, mi.Metadata) else option
            if isinstance(value, dict) and isinstance(o, mi.StructType):
                if o.tag_field is None or value.get(o.tag_field) == o.tag:
                    return _fit(value, o)
                continue
            as_map = isinstance(value, dict) and isinstance(o, mi.DictType)
            if as_map or (isinstance(value, list) and hasattr(o, "item_type")):
                return _fit(value, o)
        return value
    if isinstance(value, dict):
        if isinstance(t, mi.StructType):
            names = _names(t)
            out = {}
            for k, v in value.items():
                name, ft = names.get(k, (k, None))
                out[name] = v if ft is None else _fit(v, ft)
            return out
        if isinstance(t, mi.DictType):
            return {k: _fit(v, t.value_type) for k, v in value.items()}
        return value
    if isinstance(value, list):
        if isinstance(t, mi.TupleType):
            return [_fit(v, it) for v, it in zip(value, t.item_types, strict=False)]
        item = getattr(t, "item_type", None)
        return value if item is None else [_fit(v, item) for v in value]
    return value


def fit(value: Any, kind: Any) -> Any:
    """Decoded JSON with its keys spelled as `kind` expects: each Struct field is accepted as
    its own name, its wire name, camelCase or snake_case, so old and new files and frames
    both decode (then `msgspec.convert(fit(raw, kind), kind)`). Data maps are left alone."""
    return _fit(value, _info(kind))


def plain_component_names(doc: dict) -> dict:
    """OpenAPI component names without `_` (msgspec names generics `Page_Bot_`): `PageBot`,
    with every `$ref` to them rewritten, so no key of the document has an underscore."""
    schemas = doc.get("components", {}).get("schemas", {})
    renames = {n: n.replace("_", "") for n in schemas if "_" in n}
    if not renames:
        return doc
    prefix = "#/components/schemas/"

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if k == "$ref" and isinstance(x, str) and x.startswith(prefix):
                    name = x[len(prefix) :]
                    out[k] = prefix + renames.get(name, name)
                else:
                    out[k] = walk(x)
            return out
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    doc = walk(doc)
    doc["components"]["schemas"] = {renames.get(n, n): s for n, s in schemas.items()}
    doc["components"]["schemas"] = walk(doc["components"]["schemas"])
    return doc
