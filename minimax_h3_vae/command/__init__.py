"""The `minimax-h3-decode` command: latents file in, a verified mp4, frames or sound file out.

    console.py    the console entry: stop signals handled before torch is imported (stops.py)
    main.py       the run: main (exit codes, torchrun's process group), the decode loop with its progress
    flags.py      the flags, and their translation into the library's DecodeOptions
    preflight.py  every check before the decode, cheapest first; the decoders built through the library's doors
    sound.py      the sound: its audio VAE checked from headers, its decode (before the video load or beside it)
    checks.py     OUT checked before any work: name, folder, free space, the encoder tried on one frame
    formats.py    the output formats, the video's and the sound's descriptions, their bytes
    encoder.py    ffmpeg's binary and command lines (mp4, FLAC), the sound file it reads
    output.py     the writer for OUT's format (`open_sink`)
    sinks.py      the writers of frames and sound: Sink, .safetensors, .wav, .flac
    mux.py        the mp4 writer: H.264 and AAC from one ffmpeg process
    readback.py   a finished file read back by ffmpeg: frames and sound samples counted
    commit.py     a temporary file made OUT once verified (synced, OUT's mode, renamed), or removed
    writer.py     the background writer thread, and the NaN policy for what it writes
    colour.py     the mp4's BT.709 limited-range 4:2:0 planes, made in torch where the frames are
    report.py     what the command says: stderr lines, exit codes
    timing.py     where the wall clock goes, by phase (--verbose)
    stops.py      the stop signals, and the end on one while the command starts
    signals.py    stop signals, CPU limits, torchrun's watchdog

The library (the package above) never imports from here.
"""
