"""LLM.abort_request: a waiting or running request stops at once, its blocks freed; the
others go on exactly as if it had never been there."""
from api_helpers import prompts, tiny_llm
from transformer_lab.serve import SamplingParams


def test_abort_running_and_waiting_frees_blocks_and_leaves_the_rest_alone():
    ps = prompts(6, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = [o.token_ids for o in tiny_llm().generate(ps, params, use_tqdm=False)]
    llm = tiny_llm(max_num_seqs=3, block_size=4)
    seqs = [llm.add_request(p, params) for p in ps]
    for _ in range(3):
        llm.step()
    running, waiting = seqs[1], seqs[4]
    assert running in llm.scheduler.running and waiting in llm.scheduler.waiting
    held = len(running.block_table)
    before = llm.block_manager.blocks_in_use
    assert llm.abort_request(running) and llm.abort_request(waiting)
    assert llm.block_manager.blocks_in_use == before - held and running.block_table == []
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert not llm.abort_request(running)  # already finished
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.stats()["blocks_in_use"] == 0
    for i, seq in enumerate(seqs):
        if seq not in (running, waiting):
            assert seq.output_token_ids == expected[i]
