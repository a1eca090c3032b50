"""Hook infrastructure: TransformerLens's, imported where each release keeps it, and `QueryBlockHook`.

transformer-lens 4.x exports `HookedRootModule` from the package root; 2.x and 3.x keep it in
`transformer_lens.hook_points`, where `HookPoint` lives in every release.
"""

from transformer_lens.hook_points import HookPoint

from latentcode.models.query_block_hook import QueryBlockHook

try:
    from transformer_lens import HookedRootModule
except ImportError:  # transformer-lens < 4
    from transformer_lens.hook_points import HookedRootModule

__all__ = ["HookPoint", "HookedRootModule", "QueryBlockHook"]
