"""Kubernetes RBAC's decision for one request, as the API server's authorizer makes it.

No RBAC evaluator is on PyPI, so this follows the upstream code line by line
(kubernetes/kubernetes@v1.34.0): plugin/pkg/auth/authorizer/rbac/rbac.go `RuleAllows` (the
combined resource is `resource/subresource`), pkg/apis/rbac/v1/evaluation_helpers.go
`VerbMatches`, `APIGroupMatches`, `ResourceMatches` (`*`, exact, `*/subresource`),
`ResourceNameMatches` (no names: any; else the request's name must be listed, so a list, a
watch or a create without a name never matches a named rule), and
pkg/registry/rbac/validation/rule.go `VisitRulesFor` (ClusterRoleBindings apply in every
namespace, a RoleBinding only in its own; a subject matches a User by name, a Group by any of
the user's groups). RBAC only allows; anything no rule allows is refused. The bootstrap
policy's rules for `system:authenticated` (discovery, self-reviews) are left out: none of
them reaches a resource the tests ask about."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    verb: str
    group: str
    resource: str
    namespace: str  # "" for a cluster-scoped resource
    name: str = ""
    subresource: str = ""

    def __str__(self) -> str:
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {self.group or 'core'}/{what} {self.name!r} in {self.namespace or 'cluster'!r}"


def _rule_allows(rule: dict, r: Request) -> bool:
    combined = f"{r.resource}/{r.subresource}" if r.subresource else r.resource
    verbs = rule.get("verbs", [])
    groups = rule.get("apiGroups", [])
    resources = rule.get("resources", [])
    names = rule.get("resourceNames", [])
    if "*" not in verbs and r.verb not in verbs:
        return False
    if "*" not in groups and r.group not in groups:
        return False
    if not any(
        res == "*"
        or res == combined
        or (
            r.subresource
            and len(res) == len(r.subresource) + 2
            and res.startswith("*/")
            and res.endswith(r.subresource)
        )
        for res in resources
    ):
        return False
    return not names or r.name in names


def _subject_matches(subject: dict, user: str, groups: list[str]) -> bool:
    if subject["kind"] == "User":
        return subject["name"] == user
    if subject["kind"] == "Group":
        return subject["name"] in groups
    if subject["kind"] == "ServiceAccount":  # rule.go appliesToUser: serviceaccount.MakeUsername
        return user == f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    return False


def allowed(objects: list[dict], user: str, groups: list[str], r: Request) -> bool:
    """Whether `objects` (Roles, ClusterRoles and their bindings) allow `r` for the user."""
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
    for binding in objects:
        kind = binding["kind"]
        if kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        where = binding["metadata"].get("namespace", "")
        if kind == "RoleBinding" and where != r.namespace:
            continue
        if not any(_subject_matches(s, user, groups) for s in binding.get("subjects", [])):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else "", ref["name"]))
        if role and any(_rule_allows(rule, r) for rule in role.get("rules", [])):
            return True
    return False
