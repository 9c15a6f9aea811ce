"""Plotly figures (and shaded text) from plain arrays and token strings; no torch, no gradio."""
