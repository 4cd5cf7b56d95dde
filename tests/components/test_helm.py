from components import helm
from tests import tokens


def test_deep_merge_merges_maps_replaces_lists_and_leaves_inputs_alone():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    override = {"a": {"c": [3], "e": {"f": True}}, "g": None}
    merged = helm.deep_merge(base, override)
    assert merged == {"a": {"b": 1, "c": [3], "e": {"f": True}}, "d": "x", "g": None}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    merged["a"]["e"]["f"] = False
    assert override["a"]["e"]["f"] is True


def test_every_release_reads_a_values_file_a_user_can_edit(default_run):
    releases = [r for r in default_run.of_type(tokens.RELEASE)]
    for r in releases:
        chart = helm.Chart(r.inputs["name"], r.inputs["namespace"], r.inputs["chart"], r.inputs["version"])
        assert chart.values_file.is_file(), chart.values_file
