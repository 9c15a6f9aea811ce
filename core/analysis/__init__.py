"""What is built on the forward pass and its records: attention capture for long texts (capture), what each head
does and whether it matters (heads), and the views the app's pages read (inspect)."""
