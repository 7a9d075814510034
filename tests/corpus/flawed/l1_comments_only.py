# expect: L1
# why: the file holds only comments: no import of Environment and no class at all.
# detail: Environment
