"""The course's figures (the Learn tab): each lesson's `Measured.values` drawn with ui/plots, one module a part of
the theory as in ui/services/learn. Each module has FIGURES: {lesson name: function(Measured) → plotly Figure}."""

from __future__ import annotations


def figures() -> dict:
    """Every lesson's drawing function, by lesson name."""
    from ui.views.learn import attention, block, composition, cost, evidence, generation, positions, sinks
    return {**attention.FIGURES, **positions.FIGURES, **block.FIGURES, **generation.FIGURES, **cost.FIGURES,
            **sinks.FIGURES, **evidence.FIGURES, **composition.FIGURES}


def figure(name: str, measured):
    """The figure of lesson `name` for its measurement."""
    return figures()[name](measured)
