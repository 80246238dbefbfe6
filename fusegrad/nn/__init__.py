"""fusegrad.nn: modules, layers, losses and initialisers with PyTorch's names and semantics.

Layers are compositions of lazy Tensor ops (`nn.functional`), so a model's forward pass, its
backward pass and the optimizer's update fuse like any other graph.
"""
from fusegrad.nn.module import Module, Parameter, Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict
from fusegrad.nn.layers import (Identity, Linear, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                                ConvTranspose3d, MaxPool1d, MaxPool2d, MaxPool3d, AvgPool1d, AvgPool2d,
                                AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, BatchNorm1d,
                                BatchNorm2d, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, LayerNorm, RMSNorm,
                                GroupNorm, Embedding, Dropout, Flatten, Unflatten, MultiheadAttention, ReLU, ReLU6,
                                LeakyReLU, ELU, GELU, SiLU, Mish, Softplus, Sigmoid, Tanh, Hardtanh, Hardsigmoid,
                                Hardswish, GLU, LogSigmoid, Softmax, LogSoftmax, Softmin, CELU, SELU, MSELoss, L1Loss,
                                SmoothL1Loss, HuberLoss, CrossEntropyLoss, NLLLoss, BCELoss, BCEWithLogitsLoss, KLDivLoss)
from fusegrad.nn.layers import Bilinear, EmbeddingBag, LocalResponseNorm, CrossMapLRN2d
from fusegrad.nn.activation import PReLU, RReLU, Hardshrink, Softshrink, Tanhshrink, Threshold, Softsign
from fusegrad.nn.dropout import Dropout1d, Dropout2d, Dropout3d, AlphaDropout, FeatureAlphaDropout
from fusegrad.nn.padding import (ZeroPad1d, ZeroPad2d, ZeroPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d,
                                 ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
                                 ReplicationPad3d, CircularPad1d, CircularPad2d, CircularPad3d)
from fusegrad.nn.sampling import (PixelShuffle, PixelUnshuffle, ChannelShuffle, Upsample, UpsamplingNearest2d,
                                  UpsamplingBilinear2d, Fold, Unfold)
from fusegrad.nn.transformer import (Transformer, TransformerEncoder, TransformerDecoder, TransformerEncoderLayer,
                                     TransformerDecoderLayer)
from fusegrad.nn.rnn import RNNBase, RNN, LSTM, GRU, RNNCellBase, RNNCell, LSTMCell, GRUCell
from fusegrad.nn import functional, init, utils  # noqa: F401


def __getattr__(name: str):
  # fusegrad.nn.state (safetensors files) is imported on first use
  if name == "state":
    import importlib
    return importlib.import_module("fusegrad.nn.state")
  raise AttributeError(f"module 'fusegrad.nn' has no attribute {name!r}")
from fusegrad.nn.losses import (MarginRankingLoss, TripletMarginLoss, TripletMarginWithDistanceLoss,  # noqa: E402
                                CosineEmbeddingLoss, MultiLabelSoftMarginLoss, MultiLabelMarginLoss, MultiMarginLoss,
                                PoissonNLLLoss, GaussianNLLLoss, HingeEmbeddingLoss, SoftMarginLoss, PairwiseDistance,
                                CosineSimilarity)
