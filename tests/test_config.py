"""`TransformerConfig`, the presets, and clear errors for bad configurations."""

import dataclasses

import pytest

from keras_transformer import PRESETS, Transformer, TransformerConfig, get_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_config(name):
    """Each preset passes validation again, has integral heads and distinct special ids."""
    preset = get_preset(name)
    assert TransformerConfig(**dataclasses.asdict(preset)) == preset
    assert preset.d_model % preset.num_heads == 0  # integral head size
    assert preset.d_model % 2 == 0  # sinusoidal encoding pairs
    assert len({preset.pad_id, preset.bos_id, preset.eos_id}) == 3
    assert Transformer.from_preset(name).config == preset


def test_get_preset_overrides_change_only_what_they_name():
    tiny = PRESETS["tiny"]
    config = get_preset("tiny", vocab_size=tiny.vocab_size + 1, num_layers=tiny.num_layers + 1)
    changed = {
        field.name
        for field in dataclasses.fields(config)
        if getattr(config, field.name) != getattr(tiny, field.name)
    }
    assert changed == {"vocab_size", "num_layers"}
    assert get_preset("tiny") == tiny  # the preset itself is untouched
    with pytest.raises(TypeError, match="no_such_field"):
        get_preset("tiny", no_such_field=1)


def test_model_from_preset_keeps_model_kwargs_apart():
    model = Transformer.from_preset("tiny", vocab_size=50, name="translator")
    assert model.name == "translator"
    assert model.config == get_preset("tiny", vocab_size=50)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"d_model": 100, "num_heads": 8}, "d_model=100 must be divisible by num_heads=8"),
        ({"dropout": 1.0}, r"dropout=1\.0"),
        ({"dropout": -0.1}, r"dropout=-0\.1"),
        ({"attention_dropout": 1.5}, r"attention_dropout=1\.5"),
        ({"vocab_size": 0}, "vocab_size=0"),
        ({"num_layers": 2.5}, r"num_layers=2\.5"),
        ({"d_model": 66, "num_heads": 2}, None),  # valid: even and divisible
        ({"pad_id": 1000}, "pad_id=1000"),
    ],
)
def test_bad_config_raises_value_error_naming_the_value(overrides, match):
    if match is None:
        assert get_preset("tiny", **overrides).d_model == 66
        return
    with pytest.raises(ValueError, match=match):
        get_preset("tiny", **overrides)
    with pytest.raises(ValueError, match=match):
        Transformer.from_preset("tiny", **overrides)


def test_odd_d_model_is_rejected():
    with pytest.raises(ValueError, match="d_model=9 must be even"):
        TransformerConfig(d_model=9, num_heads=3)


def test_unknown_preset_names_the_value():
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        get_preset("huge")
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        Transformer.from_preset("huge")
