import pytest
from app.proxy.clock import StreamClock
from tests.e2e import test_e2e_ttft as t
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

def test_mut(monkeypatch, e2e_proxy, vllm_b32):
    orig = StreamClock.first_byte
    def fb(self, now):
        orig(self, now)
        if self.timings.first_token is None:
            self.timings.first_token = now
    monkeypatch.setattr(StreamClock, "first_byte", fb)
    t.test_ttft_stamped_at_first_text_chunk_not_role_or_empty_chunks(e2e_proxy, vllm_b32)

def test_real(e2e_proxy, vllm_b32):
    t.test_ttft_stamped_at_first_text_chunk_not_role_or_empty_chunks(e2e_proxy, vllm_b32)
