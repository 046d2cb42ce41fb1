"""The one walk of the CRD's schema (toolrl_api.validation.schema_places) that finds the rules, the
schema each rule runs against, and the values each rule is evaluated on."""

from __future__ import annotations

from toolrl_api.crd_schema import SPEC_SCHEMA
from toolrl_api.validation import _places, crd_validator, rules, schema_places


def test_each_place_is_visited_once_after_the_place_above_it() -> None:
    seen: list[tuple[str, ...]] = []
    for place, _sub in schema_places(SPEC_SCHEMA):
        assert place not in seen, place
        assert place == () or place[:-1] in seen, f"{place} before {place[:-1]}"
        seen.append(place)
    assert ("tools", "[]", "function") in seen and ("trainer", "mode") in seen


def test_each_subschema_is_the_one_at_its_place() -> None:
    places = dict(schema_places(SPEC_SCHEMA))
    assert places[()] is SPEC_SCHEMA
    assert places[("tools", "[]")] is SPEC_SCHEMA["properties"]["tools"]["items"]
    assert places[("trainer", "mode")] is SPEC_SCHEMA["properties"]["trainer"]["properties"]["mode"]
    # every rule sits at a visited place, and is compiled against that place's schema
    assert {r.where for r in rules()} <= set(places)
    for compiled in crd_validator().rules:
        assert compiled.schema is places[compiled.rule.where], compiled.rule.place


def test_values_are_found_at_a_place_in_each_item_and_map_value() -> None:
    spec = {"tools": [{"name": "a"}, {"name": "b", "function": {"configMap": "c"}}]}
    found = list(_places(SPEC_SCHEMA, spec, ("tools", "[]", "function"), "spec"))
    assert found == [("spec.tools[1].function", {"configMap": "c"})]
    names = list(_places(SPEC_SCHEMA, spec, ("tools", "[]", "name"), "spec"))
    assert names == [("spec.tools[0].name", "a"), ("spec.tools[1].name", "b")]
    pool = {"toolPool": {"nodeSelector": {"zone": "a", "disk": "ssd"}}}
    selected = list(_places(SPEC_SCHEMA, pool, ("toolPool", "nodeSelector", "{}"), "spec"))
    where = "spec.toolPool.nodeSelector"
    assert selected == [(f"{where}['zone']", "a"), (f"{where}['disk']", "ssd")]
