"""What several experiments share (and no experiment owns): their report pieces and measurement
harnesses. Any experiment may import the kit; the kit imports no experiment."""
