"""Recording calls: the recorder, the line format, the file, the renderer."""
