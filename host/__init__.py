"""The host side: what runs on the computer a board is plugged into.

The wire protocol (protocol.py), the client that speaks it over a serial port (client.py) and the
chat on top of it (chat.py), the emulators that stand in for a board (emulator.py, cycle-exact:
clocked_device.py; their common decoder side: emulator_chip.py, lora_sram.py), and the flasher
(flash.py, openFPGALoader). The gateware these talk to is in boards/.
"""
