"""What a LabConfig selects, checked and looked up once: `Choices.of(config)`.

The config is checked (`check_config`: None gives the defaults, anything but a LabConfig is a
TypeError), its write policy found in the registry (the one lookup of `nwor_mode`), and
`state_mode='auto'` resolved through what that policy declares (`WritePolicy.state_counterpart`),
never through its name. `prepare` makes one and hands it to `SpecEngine`, which makes its own only
when given a plain LabConfig (or None); below the engine, the policies receive the class and the
checked config.
"""
from __future__ import annotations

from dataclasses import dataclass

from nwor_lab.config import LabConfig, check_config
from nwor_lab.policies import WritePolicy, policy_class


@dataclass(frozen=True)
class Choices:
    """config: the checked LabConfig; policy: the write policy class its `nwor_mode` names."""

    config: LabConfig
    policy: type[WritePolicy]

    @classmethod
    def of(cls, config: "LabConfig | Choices | None", name: str = "config") -> "Choices":
        """`config` checked and looked up (a Choices is returned as it is: already checked)."""
        if isinstance(config, Choices):
            return config
        config = check_config(name, config)
        return cls(config, policy_class(config))

    def state_config(self) -> LabConfig:
        """The config a hybrid target's state strategy is built from: `state_mode='auto'` replaced by
        the policy's declared `state_counterpart` (other values as they are)."""
        if self.config.state_mode != "auto":
            return self.config
        counterpart = self.policy.state_counterpart
        if counterpart is None:
            from nwor_lab.config import state_modes
            raise ValueError(f"state_mode='auto': the write policy nwor_mode={self.config.nwor_mode!r} declares no "
                             f"state counterpart ({self.policy.__name__}.state_counterpart is None); set "
                             f"LabConfig.state_mode (or NWOR_LAB_STATE_MODE) to one of "
                             f"{', '.join(state_modes()[1:])}")
        return self.config.replace(state_mode=counterpart)
