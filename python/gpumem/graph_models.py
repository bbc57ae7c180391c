"""Small models for the CUDA graph checks and benchmarks: a GPT-2-shaped
decoder written with plain PyTorch operations (no data-dependent host
synchronisation, so a whole training step can be captured), and the
capture of a training step as PyTorch's documentation describes it."""


def gpt(vocab=50257, dim=768, layers=12, heads=12, seq=1024):
    """A GPT-2-shaped decoder (GPT-2 small by default): token and position
    embeddings, pre-norm blocks of causal self-attention and an MLP, a tied
    output head, initialised as GPT-2 is (normal weights of standard
    deviation 0.02, the residual projections' scaled down by the depth, zero
    biases), so the first losses are near ln(vocab). Returns the module;
    calling it on tokens gives the mean next-token cross-entropy."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln(x) @ self.tok.weight.t()
            return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), idx[:, 1:].reshape(-1))

    model = GPT()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "ln" in name:
                p.fill_(1.0)
            else:
                std = 0.02 / (2 * layers) ** 0.5 if name.endswith(("proj.weight", "out.weight")) else 0.02
                p.normal_(0.0, std)
    return model


def captured_step(model, opt, tokens, warmup=3, autocast=None):
    """Captures one training step (forward, backward, optimizer step) of
    `model` on the static input `tokens` into a CUDA graph, after `warmup`
    eager steps on a side stream (as torch.cuda.graph requires). Returns
    (graph, static loss tensor). `opt` must be made with capturable=True."""
    import contextlib
    import torch

    ctx = (lambda: torch.autocast("cuda", dtype=autocast, cache_enabled=False)) if autocast else contextlib.nullcontext

    def step():
        with ctx():
            loss = model(tokens)
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        loss = step()
    return g, loss
