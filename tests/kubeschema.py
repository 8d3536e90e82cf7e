"""
How the Kubernetes API server checks a custom resource against its CRD,
for L{tests.tinkerbellschemas} (issue 28, item 6); kubernetes
C{staging/src/k8s.io/apiextensions-apiserver}:
C{pkg/registry/customresource/validator.go},
C{pkg/apiserver/validation/formats.go}, and apimachinery's
C{ValidateObjectMeta}.

  - C{metadata} is not the schema's (it says only C{type: object}) but
    C{ObjectMeta}'s (L{metadataProblems}): the name a DNS-1123 subdomain,
    the namespace a DNS-1123 label, label keys qualified names and values
    at most 63 characters of the label alphabet, annotation keys qualified
    names.
  - The rest against the served version's C{openAPIV3Schema}, with
    C{jsonschema} (OpenAPI 3.0's schema object is JSON Schema draft 4 plus
    extensions): types, C{required}, C{enum}, C{pattern} (searched, not
    anchored, as Go's C{regexp} does), C{maxProperties}, C{anyOf}.
  - C{x-kubernetes-int-or-string}: an integer or a string.
    C{x-kubernetes-preserve-unknown-fields}: unknown fields allowed there.
    C{x-kubernetes-list-type: atomic}/C{set} and C{x-kubernetes-map-type}:
    how server-side apply merges (a C{set} is also unique).
    C{x-kubernetes-validations} (CEL): each rule is written out in Python
    in L{CEL_RULES}.
  - C{format}: only the formats Kubernetes checks, as it checks them
    (C{uri}: Go's C{url.ParseRequestURI}, an absolute URI or an absolute
    path; C{date-time}: RFC 3339). A format Kubernetes does not know (e.g.
    C{url}) and the integer formats are not checked, as the server does
    not check them.
  - C{default} is applied by the server: not checked.

A keyword, extension, format or CEL rule not modelled here stops the
loading (L{UnsupportedSchema}): an updated manifest cannot pass by being
half-read.

Unknown fields: stricter than the API server, on purpose. Every
C{apiextensions.k8s.io/v1} schema is structural, and the server prunes a
field its schema does not name (except under
C{x-kubernetes-preserve-unknown-fields}): it answers 201 and drops it, or,
with C{fieldValidation=Strict}, refuses it. Either way a misspelt field
never reaches the controller. Here each object schema that does not
preserve unknown fields gets C{additionalProperties: false} (L{strictSchema}),
so the typo fails the test; the same for a field C{ObjectMeta} does not
have, and for a C{null} where the schema has no C{nullable} (the server
drops it). C{metadata.name} is required (no C{generateName}): fleetd names
its objects so that a restart finds them instead of creating twice.

Each problem is one line in the API server's words, naming its path
(C{spec.interfaces[0].netboot.allowPXE: Invalid value: "yes": must be of
type boolean}).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from jsonschema import Draft4Validator, FormatChecker, ValidationError, validators
from jsonschema.protocols import Validator


class UnsupportedSchema(Exception):
    """A CRD uses something this module does not model (named with its path)."""


# CEL rules (x-kubernetes-validations), each as the Python it means.
def _bothOrNeither(a: str, b: str) -> Callable[[Mapping[str, Any]], bool]:
    def rule(obj: Mapping[str, Any]) -> bool:
        return bool(obj.get(a, "") != "") == bool(obj.get(b, "") != "")

    return rule


CEL_RULES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    # tinkerbell Hardware spec.interfaces[].dhcp
    '(has(self.tftp_server_name) && self.tftp_server_name != "") =='
    ' (has(self.boot_file_name) && self.boot_file_name != "")': _bothOrNeither(
        "tftp_server_name", "boot_file_name"
    ),
}

# Formats: Kubernetes normalises a string format by dropping "-" and
# checks those of formats.go; these two are modelled, the others refused.
_KUBE_FORMATS = frozenset(
    "bsonobjectid uri email hostname ipv4 ipv6 cidr mac uuid uuid3 uuid4 uuid5 isbn"
    " isbn10 isbn13 creditcard ssn hexcolor rgbcolor byte password date duration"
    " datetime quantity k8sshortname k8slongname".split()
)
_MODELLED_FORMATS = {"uri": "uri", "datetime": "date-time"}
_FORMATS = FormatChecker(formats=())
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
)


@_FORMATS.checks("uri")
def _requestURI(value: object) -> bool:
    """Go's C{url.ParseRequestURI}: an absolute URI or an absolute path."""
    if not isinstance(value, str):
        return True
    if value == "" or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return False
    scheme = _SCHEME.match(value)
    if scheme is None:
        return value.startswith("/")
    rest = value[scheme.end() :]
    if not rest.startswith("//"):
        return True  # an opaque URI (mailto:...) or a path
    authority = re.split(r"[/?#]", rest[2:], maxsplit=1)[0].rpartition("@")[2]
    if authority.startswith("["):
        host, _, after = authority.partition("]")
        if after and not after.startswith(":"):
            return False
        port = after[1:]
    else:
        host, _, port = authority.partition(":")
    return " " not in host and (port == "" or port.isdigit())


@_FORMATS.checks("date-time")
def _rfc3339(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if _DATE_TIME.fullmatch(value) is None:
        return False
    try:
        datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _cel(
    validator: Validator, rules: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, dict):
        for rule in rules:
            if not CEL_RULES[rule["rule"]](instance):
                yield ValidationError(rule.get("message") or f"failed {rule['rule']}")


_Strict = validators.extend(Draft4Validator, {"x-kubernetes-validations": _cel})

_PLAIN = frozenset(
    "type properties items additionalProperties required description title format"
    " enum pattern default anyOf allOf oneOf not maxProperties minProperties"
    " maxLength minLength maximum minimum exclusiveMaximum exclusiveMinimum"
    " maxItems minItems uniqueItems multipleOf nullable example".split()
)
_EXTENSIONS = frozenset(
    {
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)
_DROPPED = frozenset(
    {"description", "title", "example", "default", "nullable", *_EXTENSIONS}
)


def strictSchema(
    node: Mapping[str, Any], where: str = "", *, junctor: bool = False
) -> dict[str, Any]:
    """
    The JSON Schema that checks what the structural schema C{node} allows,
    with unknown fields refused (see the module docstring). C{junctor}:
    inside C{anyOf}/C{allOf}/C{oneOf}/C{not}, which only constrain.

    @raise UnsupportedSchema: C{node} uses something not modelled here.
    """
    at = where or "<root>"
    unknown = sorted(set(node) - _PLAIN - _EXTENSIONS)
    if unknown:
        raise UnsupportedSchema(f"{at}: {', '.join(unknown)} not modelled")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {
                name: strictSchema(sub, _join(where, name), junctor=junctor)
                for name, sub in value.items()
            }
        elif key == "items":
            out[key] = strictSchema(value, where + "[]", junctor=junctor)
        elif key == "additionalProperties" and isinstance(value, Mapping):
            out[key] = strictSchema(value, where + "[*]", junctor=junctor)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [strictSchema(branch, where, junctor=True) for branch in value]
        elif key == "not":
            out[key] = strictSchema(value, where, junctor=True)
        elif key == "format":
            normal = value.replace("-", "")
            if node.get("type", "string") != "string":
                continue  # int32, int64, float, double: not checked
            if normal in _MODELLED_FORMATS:
                out[key] = _MODELLED_FORMATS[normal]
            elif normal in _KUBE_FORMATS:
                raise UnsupportedSchema(f"{at}: format {value} not modelled")
        elif key not in _DROPPED:
            out[key] = value
    listType = node.get("x-kubernetes-list-type", "atomic")
    if listType == "set":
        out["uniqueItems"] = True
    elif listType != "atomic":
        raise UnsupportedSchema(f"{at}: x-kubernetes-list-type {listType} not modelled")
    rules = node.get("x-kubernetes-validations", [])
    for rule in rules:
        if set(rule) - {"rule", "message"} or rule["rule"] not in CEL_RULES:
            raise UnsupportedSchema(f"{at}: CEL rule not modelled: {rule}")
    if rules:
        out["x-kubernetes-validations"] = rules
    preserve = node.get("x-kubernetes-preserve-unknown-fields", False)
    if out.get("type") == "object" and not (junctor or preserve):
        out.setdefault("additionalProperties", False)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


def compileSchema(schema: Mapping[str, Any]) -> Validator:
    """A strict validator for a CRD's C{openAPIV3Schema} (L{strictSchema})."""
    validator: Validator = _Strict(strictSchema(schema), format_checker=_FORMATS)
    return validator


# ObjectMeta, as apimachinery's ValidateObjectMeta checks it.
OBJECT_META = frozenset(
    "name generateName namespace selfLink uid resourceVersion generation"
    " creationTimestamp deletionTimestamp deletionGracePeriodSeconds labels"
    " annotations ownerReferences finalizers managedFields".split()
)
_SUBDOMAIN = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_ANNOTATIONS_MAX = 256 * 1024


def _qualifiedName(key: str) -> str | None:
    parts = key.split("/")
    if len(parts) > 2 or (
        len(parts) == 2
        and (len(parts[0]) > 253 or _SUBDOMAIN.fullmatch(parts[0]) is None)
    ):
        return "the prefix must be a DNS-1123 subdomain followed by one '/'"
    name = parts[-1]
    if len(name) > 63 or _NAME_PART.fullmatch(name) is None:
        return "the name must be 1-63 of [A-Za-z0-9-_.], alphanumeric at both ends"
    return None


def metadataProblems(meta: Any, namespaced: bool) -> list[str]:
    """The API server's lines for what is wrong with C{meta} (ObjectMeta)."""
    if not isinstance(meta, dict):
        return [f"metadata: Invalid value: {show(meta)}: must be an object"]
    out = [
        f"metadata.{key}: unknown field (not in ObjectMeta)"
        for key in sorted(set(meta) - OBJECT_META)
    ]
    name = meta.get("name")
    if name is None:
        out.append("metadata.name: Required value (fleetd names its objects)")
    elif not (
        isinstance(name, str) and len(name) <= 253 and _SUBDOMAIN.fullmatch(name)
    ):
        out.append(
            f"metadata.name: Invalid value: {show(name)}: must be a lowercase"
            " RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253)"
        )
    namespace = meta.get("namespace")
    if not namespaced:
        if namespace:
            out.append("metadata.namespace: Forbidden: not allowed on this type")
    elif namespace is None:
        out.append("metadata.namespace: Required value")
    elif not (
        isinstance(namespace, str)
        and len(namespace) <= 63
        and _DNS_LABEL.fullmatch(namespace)
    ):
        out.append(
            f"metadata.namespace: Invalid value: {show(namespace)}: must be a"
            " lowercase RFC 1123 label (a-z, 0-9, '-'; at most 63)"
        )
    for field in ("labels", "annotations"):
        values = meta.get(field)
        if values is None:
            continue
        if not isinstance(values, dict):
            out.append(
                f"metadata.{field}: Invalid value: {show(values)}: must be a map"
            )
            continue
        for key, value in values.items():
            problem = _qualifiedName(key if field == "labels" else key.lower())
            if problem:
                out.append(f"metadata.{field}: Invalid value: {show(key)}: {problem}")
            if not isinstance(value, str):
                out.append(
                    f"metadata.{field}.{key}: Invalid value: {show(value)}:"
                    " must be a string"
                )
            elif (
                field == "labels"
                and value
                and (len(value) > 63 or _NAME_PART.fullmatch(value) is None)
            ):
                out.append(
                    f"metadata.labels.{key}: Invalid value: {show(value)}: must be"
                    " empty or 1-63 of [A-Za-z0-9-_.], alphanumeric at both ends"
                )
        if field == "annotations":
            size = sum(len(k) + len(str(v)) for k, v in values.items())
            if size > _ANNOTATIONS_MAX:
                out.append(
                    f"metadata.annotations: Too long: must have at most"
                    f" {_ANNOTATIONS_MAX} bytes"
                )
    return out


def show(value: Any) -> str:
    """A value as JSON, cut at 80 characters."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _path(parts: Sequence[str | int]) -> str:
    where = ""
    for part in parts:
        where = f"{where}[{part}]" if isinstance(part, int) else _join(where, part)
    return where


def _describe(error: ValidationError) -> list[str]:
    """The API server's line(s) for one schema error."""
    where = _path(list(error.absolute_path))
    check = error.validator
    want: Any = error.validator_value
    value: Any = error.instance
    schema: Any = error.schema
    if check == "additionalProperties" and want is False:
        known = set(schema.get("properties", {}))
        return [
            f"{_join(where, key)}: unknown field (not in the schema)"
            for key in sorted(set(value) - known)
        ]
    if check == "required":
        return [
            f"{_join(where, key)}: Required value" for key in want if key not in value
        ]
    at = where or "<root>"
    if check == "type":
        kinds = " or ".join(want) if isinstance(want, list) else want
        return [f"{at}: Invalid value: {show(value)}: must be of type {kinds}"]
    if check == "anyOf" and all(set(branch) == {"type"} for branch in want):
        kinds = " or ".join(branch["type"] for branch in want)
        return [f"{at}: Invalid value: {show(value)}: must be of type {kinds}"]
    if check == "enum":
        supported = ", ".join(show(v) for v in want)
        return [
            f"{at}: Unsupported value: {show(value)}: supported values: {supported}"
        ]
    if check == "pattern":
        return [f"{at}: Invalid value: {show(value)}: should match '{want}'"]
    if check == "format":
        return [f"{at}: Invalid value: {show(value)}: must be of format {want}"]
    if check == "x-kubernetes-validations":
        return [f"{at}: Invalid value: {error.message}"]
    return [f"{at}: {error.message}"]


def schemaProblems(validator: Validator, instance: Any) -> list[str]:
    """The API server's lines for what C{validator} finds in C{instance}, sorted."""
    return sorted(
        {line for e in validator.iter_errors(instance) for line in _describe(e)}
    )
