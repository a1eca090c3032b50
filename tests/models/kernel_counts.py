"""What the fused kernels' tests observe of the operators: how often each ran (a dispatch mode that counts
the `latentcode::` operators it sees) and which operators a torch.compile'd graph holds (a backend that
records its forward and backward graphs before running them as AOT-eager does)."""

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class CountOps(TorchDispatchMode):
    """Within the block, `counts["gelu_tanh"]` (...) is how often each `latentcode::` operator ran."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func._schema.name.partition("::")
        if namespace == "latentcode":
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def recording_backend():
    """`(backend, graphs)`: a torch.compile backend (AOT autograd, graphs run as they are) and the list of the
    operator names (`latentcode::gelu_tanh`, `aten::mm`, ...) of each forward and backward graph it compiled."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs: list[list[str]] = []

    def record(graph_module, example_inputs):
        graphs.append([node.target._schema.name for node in graph_module.graph.nodes
                       if node.op == "call_function" and hasattr(node.target, "_schema")])
        return make_boxed_func(graph_module.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record), graphs
