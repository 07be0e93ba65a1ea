"""`python -m minimax_h3_vae.command`: the `minimax-h3-decode` command."""

from .console import console_main

console_main()
