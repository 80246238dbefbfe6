"""minGPT's model (github.com/karpathy/minGPT, mingpt/model.py, MIT) as its code is written, against a `torch` module
argument so the same source builds the PyTorch model and the fusegrad one (`import fusegrad as torch`): NewGELU
written out with tanh and pow, attention masked through a registered tril buffer, the MLP as a ModuleDict called
through a lambda, weight decay split by module type. Left out: `from_pretrained` (a Hugging Face download) and
`generate`; the config is a dataclass instead of minGPT's CfgNode."""
import math
from dataclasses import dataclass


@dataclass
class MinGPTConfig:
  vocab_size: int = 65
  block_size: int = 32
  n_layer: int = 2
  n_head: int = 2
  n_embd: int = 32
  embd_pdrop: float = 0.0
  resid_pdrop: float = 0.0
  attn_pdrop: float = 0.0


def build(torch):
  nn = torch.nn
  F = torch.nn.functional

  class NewGELU(nn.Module):
    def forward(self, x):
      return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

  class CausalSelfAttention(nn.Module):
    def __init__(self, config):
      super().__init__()
      assert config.n_embd % config.n_head == 0
      self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
      self.c_proj = nn.Linear(config.n_embd, config.n_embd)
      self.attn_dropout = nn.Dropout(config.attn_pdrop)
      self.resid_dropout = nn.Dropout(config.resid_pdrop)
      self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                           .view(1, 1, config.block_size, config.block_size))
      self.n_head = config.n_head
      self.n_embd = config.n_embd

    def forward(self, x):
      B, T, C = x.size()
      q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
      k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
      q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
      v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
      att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
      att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
      att = F.softmax(att, dim=-1)
      att = self.attn_dropout(att)
      y = att @ v
      y = y.transpose(1, 2).contiguous().view(B, T, C)
      y = self.resid_dropout(self.c_proj(y))
      return y

  class Block(nn.Module):
    def __init__(self, config):
      super().__init__()
      self.ln_1 = nn.LayerNorm(config.n_embd)
      self.attn = CausalSelfAttention(config)
      self.ln_2 = nn.LayerNorm(config.n_embd)
      self.mlp = nn.ModuleDict(dict(
        c_fc=nn.Linear(config.n_embd, 4 * config.n_embd),
        c_proj=nn.Linear(4 * config.n_embd, config.n_embd),
        act=NewGELU(),
        dropout=nn.Dropout(config.resid_pdrop),
      ))
      m = self.mlp
      self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))

    def forward(self, x):
      x = x + self.attn(self.ln_1(x))
      x = x + self.mlpf(self.ln_2(x))
      return x

  class GPT(nn.Module):
    def __init__(self, config):
      super().__init__()
      self.block_size = config.block_size
      self.transformer = nn.ModuleDict(dict(
        wte=nn.Embedding(config.vocab_size, config.n_embd),
        wpe=nn.Embedding(config.block_size, config.n_embd),
        drop=nn.Dropout(config.embd_pdrop),
        h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
        ln_f=nn.LayerNorm(config.n_embd),
      ))
      self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
      self.apply(self._init_weights)
      for pn, p in self.named_parameters():
        if pn.endswith("c_proj.weight"):
          torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
      if isinstance(module, nn.Linear):
        torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None: torch.nn.init.zeros_(module.bias)
      elif isinstance(module, nn.Embedding):
        torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
      elif isinstance(module, nn.LayerNorm):
        torch.nn.init.zeros_(module.bias)
        torch.nn.init.ones_(module.weight)

    def configure_optimizers(self, weight_decay, learning_rate, betas):
      decay, no_decay = set(), set()
      whitelist_weight_modules = (torch.nn.Linear,)
      blacklist_weight_modules = (torch.nn.LayerNorm, torch.nn.Embedding)
      for mn, m in self.named_modules():
        for pn, p in m.named_parameters():
          fpn = "%s.%s" % (mn, pn) if mn else pn
          if pn.endswith("bias"): no_decay.add(fpn)
          elif pn.endswith("weight") and isinstance(m, whitelist_weight_modules): decay.add(fpn)
          elif pn.endswith("weight") and isinstance(m, blacklist_weight_modules): no_decay.add(fpn)
      param_dict = {pn: p for pn, p in self.named_parameters()}
      inter_params = decay & no_decay
      union_params = decay | no_decay
      assert len(inter_params) == 0, "parameters %s made it into both decay/no_decay sets!" % (str(inter_params),)
      assert len(param_dict.keys() - union_params) == 0, \
          "parameters %s were not separated into either decay/no_decay set!" % (str(param_dict.keys() - union_params),)
      optim_groups = [
        {"params": [param_dict[pn] for pn in sorted(list(decay))], "weight_decay": weight_decay},
        {"params": [param_dict[pn] for pn in sorted(list(no_decay))], "weight_decay": 0.0},
      ]
      return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)

    def forward(self, idx, targets=None):
      device = idx.device
      b, t = idx.size()
      assert t <= self.block_size, f"Cannot forward sequence of length {t}, block size is only {self.block_size}"
      pos = torch.arange(0, t, dtype=torch.long, device=device).unsqueeze(0)
      tok_emb = self.transformer.wte(idx)
      pos_emb = self.transformer.wpe(pos)
      x = self.transformer.drop(tok_emb + pos_emb)
      for block in self.transformer.h:
        x = block(x)
      x = self.transformer.ln_f(x)
      logits = self.lm_head(x)
      loss = None
      if targets is not None:
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
      return logits, loss

  return GPT
