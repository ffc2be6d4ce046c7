import pytest

import console


@pytest.fixture(autouse=True)
def _settings_back():
    """Each console test leaves the language and the pause as it found them."""
    lang = console.get_lang()
    yield
    console.set_lang(lang)
    console.set_pause(False)
