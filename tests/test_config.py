"""`TransformerConfig`, the presets, and clear errors for bad configurations."""

import dataclasses

import pytest

from keras_transformer import PRESETS, Transformer, TransformerConfig, get_preset


def test_presets_are_the_paper_table_3_rows():
    base, big = PRESETS["base"], PRESETS["big"]
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout) == (
        6,
        512,
        2048,
        8,
        0.1,
    )
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout) == (
        6,
        1024,
        4096,
        16,
        0.3,
    )


def test_get_preset_overrides_are_values():
    config = get_preset("tiny", vocab_size=321, dropout=0.0)
    assert config.vocab_size == 321 and config.dropout == 0.0
    assert PRESETS["tiny"].dropout != 0.0  # the preset itself is untouched
    assert dataclasses.replace(config, dropout=0.2).dropout == 0.2
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dropout = 0.5


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
