"""Pure domain logic of OpenBot Engine.

Nothing here does I/O, talks to Ray, reads a clock or draws random numbers: callers pass time and
ids in. Only the standard library and msgspec are imported (a test enforces it).
"""
