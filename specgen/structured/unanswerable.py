"""Schemas that compile but that no output specgen produces can obey: refused before queueing.

llguidance compiles a schema whose required structure never ends (an object that must hold
itself, `{"$ref": "#"}`, a cycle of `$ref`s with no way out) and then gives up at the first step
or produces nothing; and it clamps an integer range that no 64-bit integer is in to the nearest
one it can write, which breaks the range. `why_unanswerable` finds both, so the request is a 400
naming the field rather than a failed generation or an answer that breaks its schema.
"""

from __future__ import annotations

from typing import Any

INT64 = (-(2**63), 2**63 - 1)
COMBINERS = ("allOf", "anyOf", "oneOf")


def why_unanswerable(schema: Any) -> str | None:
    """Why no finite JSON value obeys `schema` as llguidance would produce it, or None."""
    nodes = _nodes(schema)
    for node in nodes:
        ranged = _integer_range(node)
        if ranged:
            return ranged
    finite: set[int] = set()
    changed = True
    while changed:  # least fixpoint: a node is finite once it is shown to be, never taken back
        changed = False
        for node in nodes:
            if id(node) not in finite and _finite(node, schema, finite):
                finite.add(id(node))
                changed = True
    if isinstance(schema, dict) and id(schema) not in finite:
        return "requires a value nested without end (a $ref cycle with no way out): no output can end"
    return None


def _integer_range(node: dict) -> str | None:
    if node.get("type") != "integer" and node.get("type") != ["integer"]:
        return None
    low = max((v for k in ("minimum", "exclusiveMinimum") if _number(v := node.get(k))), default=None)
    high = min((v for k in ("maximum", "exclusiveMaximum") if _number(v := node.get(k))), default=None)
    if (low is not None and low > INT64[1]) or (high is not None and high < INT64[0]):
        return (f"asks for an integer outside the 64-bit range ({low} to {high}), which cannot be "
                "produced exactly")
    if low is not None and high is not None and low > high:
        return f"asks for an integer from {low} to {high}: there is none"
    return None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(node: dict, root: Any, finite: set[int]) -> bool:
    """Whether `node` admits a finite value, given the nodes already shown to (`finite`)."""
    def ok(sub) -> bool:
        return sub is True or (isinstance(sub, dict) and id(sub) in finite)

    if "$ref" in node:
        target = _resolve(root, node["$ref"])
        if target is None:
            return True  # not ours to judge: llguidance names an unresolved $ref
        if not ok(target):
            return False
    if "enum" in node or "const" in node:
        return True
    if "allOf" in node and not all(ok(s) for s in node["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if key in node and not any(ok(s) for s in node[key]):
            return False
    types = node.get("type")
    types = set(types) if isinstance(types, list) else {types} if types else set()
    if types and not types <= {"object", "array"}:
        return True  # a scalar is one of the choices
    if "object" in types or "properties" in node or "required" in node:
        props = node.get("properties") or {}
        rest = node.get("additionalProperties", True)
        if not all(ok(props.get(p, rest)) for p in node.get("required") or ()):
            return "array" in types and _array_finite(node, ok)
    if "array" in types or "items" in node or "prefixItems" in node:
        return _array_finite(node, ok)
    return True


def _array_finite(node: dict, ok) -> bool:
    needed = node.get("minItems", 0)
    prefix = node.get("prefixItems") or []
    if not all(ok(s) for s in prefix[:needed]):
        return False
    items = node.get("items", True)
    return needed <= len(prefix) or isinstance(items, list) or ok(items)


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local JSON pointer `ref` ("#", "#/$defs/a") names, or None."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _nodes(schema: Any) -> list[dict]:
    """Every subschema object of `schema` (each once)."""
    out, seen, todo = [], set(), [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
                # (named subschemas: each value is one)
                todo.extend(value.values())
            elif key in ("items", "prefixItems", "additionalProperties", "not", *COMBINERS):
                todo.append(value)
    return out
