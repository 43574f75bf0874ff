"""Pure parsers: text in, typed records out. No I/O, no clock, no subprocesses."""
