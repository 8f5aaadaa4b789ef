"""Meta-tests of the conformance harness (no clause): tolerance rules, markers, loader, broken engines."""
