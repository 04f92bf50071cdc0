"""Tiny Llama with paged attention that can read a staged window, EAGLE-1 / EAGLE-3 heads, loaders."""
from nwor_lab.model.attention import AttentionMetadata, write_and_attend
from nwor_lab.model.config import LlamaConfig
from nwor_lab.model.eagle import EagleHead
from nwor_lab.model.eagle3 import Eagle3Head
from nwor_lab.model.llama import LlamaForCausalLM
from nwor_lab.model.loader import (CheckpointError, load_eagle, load_llama, load_tokenizer, save_eagle,
                                   save_llama)
from nwor_lab.model.shipped import TINY_DIR, load_tiny

__all__ = ["AttentionMetadata", "write_and_attend", "LlamaConfig", "EagleHead", "Eagle3Head", "LlamaForCausalLM",
           "CheckpointError", "load_eagle", "load_llama", "load_tokenizer", "save_eagle", "save_llama",
           "TINY_DIR", "load_tiny"]
