"""`python tools/decode_latents.py IN OUT ...`: the `minimax-h3-decode` command, run from a checkout.

Everything is in `minimax_h3_vae/command/`; see `minimax-h3-decode --help`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minimax_h3_vae.command.console import console_main  # noqa: E402

if __name__ == "__main__":
    console_main()
