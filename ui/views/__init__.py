"""Views: service results turned into what a tab shows (figures, notes, tables, files); no gradio."""
