"""The `minimax-h3-decode` command: latents file in, a verified mp4, frames or sound file out.

    console.py    the console entry: stop signals handled before torch is imported (stops.py)
    main.py       the run: main (exit codes, torchrun's process group), the decode loop with its progress
    flags.py      the flags, and their translation into the library's DecodeOptions
    preflight.py  every check before the decode, cheapest first; the decoders built through the library's doors
    output.py     OUT: its checks and the sinks that write it (mp4 through ffmpeg, safetensors, wav, flac)
    writer.py     the background writer thread, and the NaN policy for what it writes
    colour.py     the mp4's BT.709 limited-range 4:2:0 planes, made in torch where the frames are
    report.py     what the command says: stderr lines, exit codes
    stops.py      the stop signals, and the end on one while the command starts
    signals.py    stop signals, CPU limits, torchrun's watchdog

The library (the package above) never imports from here.
"""
