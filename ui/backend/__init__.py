"""Where the page's model work runs: in this process (routing), or on Ray Serve (ray_serve)."""
