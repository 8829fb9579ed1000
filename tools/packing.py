"""The code packer, in one place: a train_gpt.py as the field counts code (minified, lzma, base85, in a
two-line self-extractor). train_gpt.py imports it when PACK_CODE=1; make_record.py writes what it makes into
a record folder, and the records tools read packed files with unpack()."""

import ast
import base64
import lzma

PACKED_HEAD = b'import lzma as L,base64 as B\nexec(L.decompress(B.b85decode("'
PACKED_TAIL = b'")))\n'


def pack_source(source: bytes) -> bytes:
    """The packed form of a readable script (docstrings dropped, then ast.unparse); a packed one as it is."""
    if source.startswith(PACKED_HEAD):
        return source
    packed = lzma.compress(ast.unparse(without_docstrings(source)).encode(), preset=9 | lzma.PRESET_EXTREME)
    return PACKED_HEAD + base64.b85encode(packed) + PACKED_TAIL


def without_docstrings(source: bytes) -> ast.Module:
    """The source's AST without its module, class and function docstrings."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        documented = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        if documented and ast.get_docstring(node) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return tree


def unpack(packed: bytes) -> bytes:
    """The program a packed script runs (minified: not byte for byte the readable source)."""
    if not (packed.startswith(PACKED_HEAD) and packed.endswith(PACKED_TAIL)):
        raise ValueError("not a packed train_gpt.py: it does not start and end as pack_source writes them")
    return lzma.decompress(base64.b85decode(packed[len(PACKED_HEAD):-len(PACKED_TAIL)]))
