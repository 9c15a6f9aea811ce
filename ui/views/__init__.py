"""Views: service results turned into what a tab shows (figures, notes, tables, files); no gradio."""


class Unchanged:
    """An output a streaming view leaves as the page shows it (the event sends gr.skip() in its place)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()
