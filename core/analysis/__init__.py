"""What is built on the forward pass and its records: attention capture for long texts (capture), what each head
does and whether it matters (heads), what carries one answer (patching), every stage inside one pass and one
attention score split into the residual stream's parts (anatomy), and the views the app's pages read (inspect)."""
