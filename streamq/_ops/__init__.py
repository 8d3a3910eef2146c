"""Admin operations (sans-IO) over core, and the metrics exporter; the public face of this part
is ``streamq.admin``. Producer and ops are siblings: neither imports the other."""
