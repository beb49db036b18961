"""DUMP: record a program's imports and write them into an archive.

DUMP: what a dump run records (capture, import_order), how it orders and
copies modules into an archive (order, dumper) and when it writes at exit or
once imports settle (settle)."""
